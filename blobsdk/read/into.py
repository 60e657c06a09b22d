"""The buffer rules of ``get_into`` and ``get_many_into``: which of the caller's objects a read
may fill, as one writable byte view of their memory.

A buffer is any object that exports a writable, C-contiguous buffer (``bytearray``, a
writable ``memoryview``, ``array.array``, a numpy array, an ``mmap``), or a torch tensor on
the CPU (pinned or not, any dtype), which exports none: it is read through its bytes as a
numpy array (``tensor.view(torch.uint8).numpy()``, the same memory; torch is never imported
here, a tensor is recognised only when torch is already loaded).  The bytes are written at
the buffer's start, whatever its shape or item type (a float array receives the raw bytes).

Refused, each a TypeError as ``readinto`` and ``socket.recv_into`` refuse them, naming what
to pass instead: an object that is no buffer, a read-only one (``bytes``, a read-only
memoryview or array), one that is not C-contiguous (a strided slice, a transposed array),
and a tensor that is not on the CPU (copy it there from a pinned CPU tensor).
"""

from __future__ import annotations

import sys

KINDS = "a bytearray, a writable memoryview, a numpy array or a CPU torch tensor"


def writable_bytes(buffer: object, what: str = "get_into") -> memoryview:
    """A writable, C-contiguous, one-dimensional byte view of ``buffer``'s memory (see the
    module docstring); TypeError, naming ``what``, if it is none."""
    tensor = _torch_tensor(buffer)
    if tensor is not None:
        return _tensor_bytes(tensor, what)
    try:
        view = memoryview(buffer)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what}: buffer must be {KINDS}, not {type(buffer).__name__}") from None
    if view.readonly:
        raise TypeError(f"{what}: buffer is read-only ({type(buffer).__name__}): pass a writable one, such as a bytearray")
    if not view.c_contiguous:
        raise TypeError(
            f"{what}: buffer is not C-contiguous ({type(buffer).__name__} of shape {view.shape}): "
            "pass a contiguous one (numpy.ascontiguousarray, tensor.contiguous()) and copy from it"
        )
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _torch_tensor(buffer: object) -> object | None:
    """``buffer`` if it is a torch tensor (torch loaded already), else None."""
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None)
    return buffer if tensor_type is not None and isinstance(buffer, tensor_type) else None


def _tensor_bytes(tensor: object, what: str) -> memoryview:
    """A CPU tensor's bytes, as a view of the same memory."""
    import torch  # loaded: the buffer is one of its tensors

    assert isinstance(tensor, torch.Tensor)
    if tensor.device.type != "cpu":
        raise TypeError(
            f"{what}: a torch tensor must be on the CPU, not {tensor.device}: "
            "read into a pinned CPU tensor, then .to(device, non_blocking=True)"
        )
    if not tensor.is_contiguous():
        raise TypeError(
            f"{what}: buffer is not C-contiguous (tensor of shape {tuple(tensor.shape)}, strides {tensor.stride()}): "
            "pass a contiguous one (numpy.ascontiguousarray, tensor.contiguous()) and copy from it"
        )
    flat = tensor.detach().reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return memoryview(flat.numpy())  # type: ignore[arg-type]  # an ndarray is a buffer; its stubs do not say so
