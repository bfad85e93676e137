"""Load a bucket's AOTInductor decode package with the C++ loader and bind the loaded model's weights to it.

Nothing here imports Inductor's compiler: the package is compiled code, loaded by
``torch._C._aoti.AOTIModelPackageLoader`` (milliseconds) instead of the Python
wrapper ``torch._inductor.aoti_load_package`` (which imports the compiler, 3-11 s).

The package holds no weights (``artifacts.aoti_export``). Before its first call every
constant it lists is bound to the model's own tensor, without a copy: a
weights-less package that runs before binding kills the process (SIGSEGV,
measured), and the loader accepts a constant of the wrong shape or dtype silently,
so each is checked against the header first. The runner checks none of its inputs
either (a wrong batch runs, a non-contiguous cache gives wrong logits), so
:class:`PackagedDecodeStep` checks every input's shape, dtype, device and
contiguity on every call.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.artifacts.format import Signature, decode_tensor, named_tensors, read_checked
from warmcache.artifacts.mapped_library import checked_library
from warmcache.artifacts.package_steps import DECODE_STEP, package_step
from warmcache.errors import CacheError, UsageError, first_line
from warmcache.modeling.decode_inputs import flatten, scalars

if TYPE_CHECKING:
    from warmcache.artifacts.code_check import ModelCodeCheck

#: x86 vector ISAs from narrowest to widest (``torch.backends.cpu.get_cpu_capability()`` names).
_X86_CAPABILITIES = ("DEFAULT", "AVX2", "AVX512")


def cpu_can_run(built_for: str, here: str) -> bool:
    """Whether code generated for the ``built_for`` ISA runs on a CPU whose best is ``here``."""
    if built_for == here:
        return True
    return (
        built_for in _X86_CAPABILITIES
        and here in _X86_CAPABILITIES
        and _X86_CAPABILITIES.index(here) >= _X86_CAPABILITIES.index(built_for)
    )


@dataclass
class PackagedDecodeStep:
    """One bucket's decode step: the loaded package, called with generate()'s decode arguments."""

    loader: Any
    inputs: list[tuple[str, tuple[int, ...], str]]
    fixed: dict[str, Any]
    device: str
    where: str
    computed: tuple[Any, ...] = ()
    """The constants the package carries (:func:`decode_tensor`): bound without a copy, so kept as long as the step."""
    step: str = DECODE_STEP
    """What the package computes (``decode`` or ``prefill``, :func:`package_step`)."""

    def __call__(self, model: Any, /, **kwargs: Any) -> Any:
        from transformers.modeling_outputs import CausalLMOutputWithPast

        names, tensors = flatten(kwargs)
        return CausalLMOutputWithPast(logits=self.run(names, tensors, scalars(kwargs)), cache=kwargs["cache"])

    def run(self, names: list[str], tensors: list[Any], fixed: dict[str, Any]) -> Any:
        """The logits of one call of flat inputs (:func:`flatten`'s names and order), each input checked first."""
        self._check(names, tensors, fixed)
        (logits,) = self.loader.run(tensors)
        return logits

    def _check(self, names: list[str], tensors: list[Any], fixed: dict[str, Any]) -> None:
        if fixed != self.fixed or len(names) != len(self.inputs):
            raise UsageError(f"{self.where}: decode call {names} {fixed} is not the one the package was built for")
        for name, tensor, (expected_name, shape, dtype) in zip(names, tensors, self.inputs):
            if (
                name != expected_name
                or tuple(tensor.shape) != shape
                or str(tensor.dtype) != dtype
                or tensor.device.type != self.device
                or not tensor.is_contiguous()
            ):
                got = (
                    f"{name} {tuple(tensor.shape)} {tensor.dtype} on "
                    f"{tensor.device}{'' if tensor.is_contiguous() else ', not contiguous'}"
                )
                raise UsageError(
                    f"{self.where}: decode input {got} differs from the package's {expected_name} {shape} "
                    f"{dtype} on {self.device}"
                )


def load_package(
    root: Path, entry: str, expected: dict[str, Any], model: Any, code: ModelCodeCheck
) -> tuple[Signature, PackagedDecodeStep | None]:
    """Check, load and bind one decode package to the model's own tensors; returns its dispatch signature and the step
    (model first, like an unbound method), or no step for a prefill package (generate() runs its own prefill)."""
    return load_bound(
        root,
        entry,
        expected,
        lambda _path, _info: named_tensors(model, prefix="model."),
        _model_device(model),
        code=code,
    )


#: ``(package path, package header) -> {fqn: tensor}``: the tensors a package's constants bind to, by the step's names
#: (``model.`` + the model's own).
TensorsFor = Callable[[Path, dict[str, Any]], dict[str, Any]]


def load_bound(
    root: Path,
    entry: str,
    expected: dict[str, Any],
    own: TensorsFor,
    device: str,
    steps: tuple[str, ...] = (DECODE_STEP,),
    code: ModelCodeCheck | None = None,
) -> tuple[Signature, PackagedDecodeStep | None]:
    """Check, load and bind one package to the tensors ``own`` gives for it; returns its signature and the step, or no
    step when the package computes none of ``steps`` (not loaded).

    Every check that can be made before the package's code is loaded is made first:
    sha256, header and, given ``code``, the model code digest (``read_checked``), device,
    CPU capability, and each constant's presence, shape and dtype in ``own``.
    """
    import torch

    header, payload = read_checked(root, entry, expected, code)
    path = root / entry
    info = header.aotinductor
    if info is None:
        raise CacheError(f"{path}: not an AOTInductor package (no package header)")
    if package_step(info) not in steps:
        return header.fingerprint.signature, None
    if info["device"] != device:
        raise CacheError(
            f"{path}: AOTInductor package was built for device {info['device']!r}, the model is on "
            f"{device!r}; refusing to load it"
        )
    here = torch.backends.cpu.get_cpu_capability().upper()
    if device == "cpu" and not cpu_can_run(info["cpu_capability"], here):
        raise CacheError(
            f"{path}: AOTInductor package was built for CPU capability {info['cpu_capability']}, this "
            f"CPU offers {here}; refusing to load it"
        )
    constants = _constants_to_bind(path, own(path, info), info["constants"])
    computed = {
        fqn: decode_tensor(path, fqn, value, device) for fqn, value in info.get("computed_constants", {}).items()
    }
    constants.update(computed)
    try:
        with checked_library(root, info["library"], path) if info.get("library") else nullcontext() as library:
            opened = _open_library(library) if library and device == "cpu" else _unpack_and_open(payload)
        listed = set(opened.fqns)
        if listed != set(constants):
            raise CacheError(
                f"{path}: AOTInductor package lists constants {sorted(listed ^ set(constants))[:3]} its "
                "header does not; refusing to run it"
            )
        opened.bind(constants)
    except CacheError:
        raise
    except Exception as exc:  # a foreign torch, a broken archive: one line, never a half-bound package
        raise CacheError(
            f"{path}: AOTInductor package does not load ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    inputs = [(str(n), tuple(int(d) for d in s), str(t)) for n, s, t in info["inputs"]]
    fixed = dict(info["scalars"])
    computed_values = tuple(computed.values())
    step = PackagedDecodeStep(opened.runner, inputs, fixed, device, str(path), computed_values, package_step(info))
    return header.fingerprint.signature, step


@dataclass(frozen=True)
class _Opened:
    """A loaded package: what runs it, the constants it lists, and how every one of them is bound at once."""

    runner: Any
    fqns: Collection[str]
    bind: Callable[[dict[str, Any]], None]


def _open_library(library: str) -> _Opened:
    """The checked library loaded where it lies (:mod:`warmcache.artifacts.mapped_library`): nothing is written."""
    import torch

    num_models = 1
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(library, num_models)
    # What the package loader's load_constants does: its constants by the names the library gives them.
    name_of = {fqn: name for name, fqn in runner.get_constant_names_to_original_fqns().items()}

    def bind(constants: dict[str, Any]) -> None:
        by_name = {name_of[fqn]: tensor for fqn, tensor in constants.items()}
        runner.update_constant_buffer(by_name, use_inactive=False, validate_full_updates=True, user_managed=True)

    return _Opened(runner, name_of.keys(), bind)


def _unpack_and_open(payload: bytes) -> _Opened:
    """A package with no library to map (written before libraries were, or one others may write): its checked bytes,
    not the file again, are unpacked into a private temporary folder and loaded from there."""
    with tempfile.TemporaryDirectory(prefix="warmcache-aoti-") as work:
        package = Path(work) / "decode.pt2"
        package.write_bytes(payload)
        loader = open_loader(package)

    def bind(constants: dict[str, Any]) -> None:
        # Every listed constant at once (check_full_update), the caller's tensors without a copy (user_managed).
        loader.load_constants(constants, use_inactive=False, check_full_update=True, user_managed=True)

    return _Opened(loader, loader.get_constant_fqns(), bind)


def open_loader(package: Path) -> Any:
    """The C++ loader on one package file: its ``model`` entry, multi-threaded, one runner, the package's own device.

    The loader unpacks the package into ``$TMPDIR/aotinductor_*`` and removes that folder only when it is destroyed, so
    a load that fails (a foreign or broken ``.so``) left it in ``/tmp``. It unpacks beside the package instead, in the
    caller's work folder, which the caller removes either way (a loaded ``.so`` stays mapped after its file is gone).
    """
    import torch

    # The binding names its arguments arg0..arg4, so they can only be passed in order: each is named here.
    model_name, run_single_threaded, num_runners, device_index = "model", False, 1, -1  # device -1: the package's own
    with _temporary_files_in(package.parent):
        return torch._C._aoti.AOTIModelPackageLoader(
            str(package), model_name, run_single_threaded, num_runners, device_index
        )


@contextmanager
def _temporary_files_in(folder: Path) -> Iterator[None]:
    """``$TMPDIR`` is ``folder`` inside the block (the C++ loader reads it); Python's own temporary folder is chosen
    (and kept) first."""
    tempfile.gettempdir()
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = previous


def _model_device(model: Any) -> str:
    return str(next(model.parameters()).device.type)


def _constants_to_bind(path: Path, own: dict[str, Any], listed: dict[str, Any]) -> dict[str, Any]:
    """``{fqn: tensor}`` of ``own``'s tensors for every constant the header lists, each checked."""
    bound: dict[str, Any] = {}
    for fqn, (shape, dtype) in listed.items():
        tensor = own.get(fqn)
        if tensor is None:
            raise CacheError(
                f"{path}: AOTInductor package needs constant {fqn}, which is not a parameter or buffer of "
                "the loaded model; refusing to load it"
            )
        if list(tensor.shape) != list(shape) or str(tensor.dtype) != dtype or not tensor.is_contiguous():
            raise CacheError(
                f"{path}: AOTInductor package needs {fqn} {tuple(shape)} {dtype}, the model has "
                f"{tuple(tensor.shape)} {tensor.dtype}; refusing to load it"
            )
        bound[fqn] = tensor
    return bound
