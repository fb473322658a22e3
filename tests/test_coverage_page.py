"""docs/coverage.md is rendered from test results: one row per model_type, a cell per claimed column."""

from optimum_executorch.coverage import main, render
from optimum_executorch.testing.matrix import Cell, claimed_cells


def test_page_shows_each_claimed_cell_from_the_results(tmp_path):
    cells = claimed_cells()
    failed = Cell("gpt2", "feature-extraction", "xnnpack", "fp32")
    results = {c.id: {"outcome": "passed"} for c in cells if c != failed}
    results[failed.id] = {"outcome": "failed", "reason": "a view | over dynamic dims"}
    page = render(results)
    assert f"{len(cells)} claimed cells: {len(cells) - 1} passed, 1 failed, 0 not run." in page
    assert "| gpt2 | ❌ a view \\| over dynamic dims |" in page
    # text-generation: gemma claims xnnpack fp32 and 8da4w, not portable (llama, a representative, claims all three).
    section = page.split("## text-generation")[1].split("## ")[0].splitlines()
    assert section[2] == "| model_type | xnnpack fp32 | xnnpack 8da4w | portable fp32 |"
    assert "| gemma | ✅ | ✅ |  |" in section and "| llama | ✅ | ✅ | ✅ |" in section
    assert "0 passed" in render({}) and "not run" in render({})


def test_command_needs_results(tmp_path, capsys):
    assert main(["--results", str(tmp_path / "none.json"), "--output", str(tmp_path / "c.md")]) == 2
    assert "run the test suite first" in capsys.readouterr().err
