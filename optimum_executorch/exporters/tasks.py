"""Task registry: task name -> transformers AutoModel class, exportable wrapper, runtime class.

A task plugs in with `register_task(TaskSpec(...))`. Nothing else in the pipeline names a task.
"""

import importlib
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

from .registry import lookup, register


@dataclass(frozen=True)
class TaskSpec:
    """How one task is exported and run.

    Args:
        name: the CLI / API task name (`text-generation`).
        auto_model_class: name of the transformers Auto class that loads the eager model.
        wrapper: "module:Class" of the `nn.Module` wrapper that makes the model exportable for this task.
        runtime_class: name of the `optimum_executorch` runtime class that serves the program.
        output_name: the field of the transformers model output that the program returns.
        llm_runner: the program follows the contract of ExecuTorch's C++ LLM runner (`TextLLMRunner`); the
            export then checks that the runner tokenizes like the Hugging Face tokenizer.
        lm_head: the task's model ends in a vocabulary projection, which configs may tie to the embedding.
        preprocessors: what turns the user's input into the program's input, saved with the export so that
            `pipeline(task, model=out)` works from the output directory alone: `tokenizer`, `image_processor`, `feature_extractor`.
    """

    name: str
    auto_model_class: str
    wrapper: str
    runtime_class: str
    output_name: str = "logits"
    llm_runner: bool = False
    lm_head: bool = False
    preprocessors: Tuple[str, ...] = ("tokenizer",)

    def load_auto_class(self):
        import transformers

        return getattr(transformers, self.auto_model_class)

    def load_wrapper_class(self) -> Callable:
        module, _, cls = self.wrapper.partition(":")
        return getattr(importlib.import_module(module, package=__package__), cls)


TASKS: Dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    return register(TASKS, spec.name, spec, "Task")


def get_task(name: str) -> TaskSpec:
    return lookup(TASKS, name, "Task")


register_task(
    TaskSpec(
        name="text-generation",
        auto_model_class="AutoModelForCausalLM",
        wrapper=".wrappers.causal_lm:CausalLMExportableModule",
        runtime_class="ExecuTorchModelForCausalLM",
        llm_runner=True,
        lm_head=True,
    )
)

_ENCODER_WRAPPER = ".wrappers.encoder:EncoderExportableModule"
for _name, _auto, _runtime, _output in (
    ("feature-extraction", "AutoModel", "ExecuTorchModelForFeatureExtraction", "last_hidden_state"),
    ("fill-mask", "AutoModelForMaskedLM", "ExecuTorchModelForMaskedLM", "logits"),
    ("text-classification", "AutoModelForSequenceClassification", "ExecuTorchModelForSequenceClassification", "logits"),
    ("token-classification", "AutoModelForTokenClassification", "ExecuTorchModelForTokenClassification", "logits"),
):
    register_task(TaskSpec(_name, _auto, _ENCODER_WRAPPER, _runtime, _output, lm_head=_name == "fill-mask"))

register_task(
    TaskSpec(
        name="image-classification",
        auto_model_class="AutoModelForImageClassification",
        wrapper=".wrappers.vision:ImageClassifierExportableModule",
        runtime_class="ExecuTorchModelForImageClassification",
        preprocessors=("image_processor",),
    )
)

register_task(
    TaskSpec(
        name="text2text-generation",
        auto_model_class="AutoModelForSeq2SeqLM",
        wrapper=".wrappers.seq2seq:Seq2SeqExportableModule",
        runtime_class="ExecuTorchModelForSeq2SeqLM",
        lm_head=True,
    )
)

register_task(
    TaskSpec(
        name="automatic-speech-recognition",
        auto_model_class="AutoModelForSpeechSeq2Seq",
        wrapper=".wrappers.speech:SpeechSeq2SeqExportableModule",
        runtime_class="ExecuTorchModelForSpeechSeq2Seq",
        lm_head=True,
        preprocessors=("tokenizer", "feature_extractor"),
    )
)
