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
a tensor that is not on the CPU (copy it there from a pinned CPU tensor), one that is not
dense (sparse, nested), and a lazy view whose memory is not what it shows: a conjugate view
(``tensor.conj()`` of a complex tensor) or a negative view (its negative bit set, as the
imaginary part of one): the bytes written would read back conjugated or negated.

The buffer is the caller's, written by the read and by nobody else until the read returns.
A chunk read straight into it is verified there; if it fails, the store's copy is read again
into the client's own memory: if that one verifies, the caller's buffer changed under the
read, which raises BufferChanged and blames no store (blobsdk/tail/replicaread.py).
"""

from __future__ import annotations

import sys

from .._extras import requires_extra

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
    if tensor.is_nested or tensor.layout is not torch.strided:
        layout = "nested" if tensor.is_nested else str(tensor.layout)
        raise TypeError(f"{what}: buffer is not a dense tensor ({layout}): pass a dense one (tensor.to_dense()) and copy from it")
    if tensor.is_conj() or tensor.is_neg():
        kind, resolve = ("conjugate", "resolve_conj") if tensor.is_conj() else ("negative", "resolve_neg")
        raise TypeError(
            f"{what}: buffer is a {kind} view (tensor of shape {tuple(tensor.shape)} with its {kind} bit set): "
            f"pass a tensor of its own (tensor.{resolve}()) and copy from it"
        )
    if not tensor.is_contiguous():
        raise TypeError(
            f"{what}: buffer is not C-contiguous (tensor of shape {tuple(tensor.shape)}, strides {tensor.stride()}): "
            "pass a contiguous one (numpy.ascontiguousarray, tensor.contiguous()) and copy from it"
        )
    with requires_extra("torch", f"reading into a torch tensor ({what})"):  # torch's wheels do not bring numpy
        import numpy  # noqa: F401  # without it, Tensor.numpy() raises RuntimeError("Numpy is not available")
    flat = tensor.detach().reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return memoryview(flat.numpy())  # type: ignore[arg-type]  # an ndarray is a buffer; its stubs do not say so
