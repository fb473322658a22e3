"""The runtime narrows libtorch's OpenMP and MKL pools while a program runs, and restores them after."""

import ctypes

import torch

from optimum_executorch.modeling.threads import _function, exclusive_cores


def _mkl_threads():
    get = _function("libtorch_cpu.so", "MKL_Get_Max_Threads", ctypes.c_int, [])
    return get() if get else None


def test_exclusive_cores_narrows_and_restores():
    before_torch, before_mkl = torch.get_num_threads(), _mkl_threads()
    with exclusive_cores():
        assert torch.get_num_threads() == 1
        with exclusive_cores():  # nested: keeps the outer setting
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
        if before_mkl is not None:
            assert _mkl_threads() == 1
    assert torch.get_num_threads() == before_torch
    assert _mkl_threads() == before_mkl


def test_exclusive_cores_restores_after_an_error():
    before = torch.get_num_threads()
    try:
        with exclusive_cores():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert torch.get_num_threads() == before


def test_generate_leaves_eager_threads_alone(et_model):
    torch.set_num_threads(2)
    seen = []
    original = et_model._forward_method

    class Spy:
        def execute(self, inputs):
            seen.append(torch.get_num_threads())
            return original.execute(inputs)

    et_model._forward_method = Spy()
    try:
        et_model.generate(torch.tensor([[5, 17, 42]]), max_new_tokens=4, do_sample=False)
        et_model.forward(torch.tensor([[5, 17, 42]]))
    finally:
        et_model._forward_method = original
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2
