"""Cache memory on a device without PyTorch: ONNX Runtime allocates it (OrtValues, whose addresses IO binding and
TensorRT take), and one-node ONNX graphs move it (runtime.backends.device_graphs), since Python cannot index device
memory. The device backend and the TensorRT backend both keep their cache in a PingPong: two buffer sets, a beam
reorder gathering the current set's rows into the other. With device "cpu" the same code runs on host memory,
which is how it is tested on machines without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .device_graphs import gather_model, pad_model

OUTER_RANK, BLOCK_RANK = 3, 4
ORT_TYPES = {"tensor(float)": np.dtype(np.float32), "tensor(float16)": np.dtype(np.float16),
             "tensor(int32)": np.dtype(np.int32), "tensor(int64)": np.dtype(np.int64)}
POSITIONS_AXIS = 2  # of a cache tensor (rows, nh, positions, d)


class DeviceMemory:
    """Allocation, copies and the one-node graphs on one device ("cuda" or "cpu") for one cache dtype."""

    def __init__(self, device: str, providers: list, dtype: np.dtype) -> None:
        self.device, self.dtype = device, np.dtype(dtype)
        self.element = np.float16 if self.dtype == np.float16 else np.float32
        block = (self.dtype, OUTER_RANK)
        self._gather_rows = ort.InferenceSession(gather_model([block, block], axis=1), providers=providers)
        self._gather_sources: dict[tuple, ort.InferenceSession] = {}
        self._providers = providers
        flat = (self.dtype, BLOCK_RANK)
        self._pad = ort.InferenceSession(pad_model([flat], axis=POSITIONS_AXIS), providers=providers)

    def upload(self, array: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, 0)

    def zeros(self, shape: tuple[int, ...]) -> ort.OrtValue:
        """Zeros of the cache dtype made on the device (padding an empty tensor), not uploaded from the host."""
        empty = self.upload(np.zeros((*shape[:POSITIONS_AXIS], 0, *shape[POSITIONS_AXIS + 1:]), self.dtype))
        return self.padded(empty, shape[POSITIONS_AXIS])

    def padded(self, value: ort.OrtValue | tuple[int, tuple[int, ...]], positions: int,
               into: int | None = None) -> ort.OrtValue:
        """A (rows, nh, P, d) tensor (an OrtValue, or an address and shape) with zero positions added up to
        `positions`: in new memory, or at address `into` (which must hold it)."""
        binding = self._pad.io_binding()
        if isinstance(value, ort.OrtValue):
            shape = tuple(value.shape())
            binding.bind_ortvalue_input("x0", value)
        else:
            address, shape = value
            binding.bind_input("x0", self.device, 0, self.element, shape, address)
        grown = (*shape[:POSITIONS_AXIS], positions, *shape[POSITIONS_AXIS + 1:])
        if into is None:
            binding.bind_output("y0", self.device, 0)
        else:
            binding.bind_output("y0", self.device, 0, self.element, grown, into)
        pads = np.zeros(2 * BLOCK_RANK, np.int64)
        pads[BLOCK_RANK + POSITIONS_AXIS] = positions - shape[POSITIONS_AXIS]  # at the end of the axis
        binding.bind_cpu_input("pads", pads)
        self._pad.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    def gather_sources(self, values: tuple[ort.OrtValue, ...], mask: ort.OrtValue, sources: np.ndarray,
                       into: tuple[ort.OrtValue, ...] | None = None) -> tuple[tuple[ort.OrtValue, ...], ort.OrtValue]:
        """The cross keys/values and mask of the given sources (rows of each): in new memory, or written into the
        tensors `into` (the values' then the mask's, each shaped for len(sources) rows)."""
        tensors = tuple((ORT_TYPES[v.data_type()], len(v.shape())) for v in (*values, mask))
        if tensors not in self._gather_sources:  # one session per set of inputs, made when first needed
            self._gather_sources[tensors] = ort.InferenceSession(gather_model(tensors, axis=0),
                                                                 providers=self._providers)
        session = self._gather_sources[tensors]
        binding = session.io_binding()
        for i, value in enumerate((*values, mask)):
            binding.bind_ortvalue_input(f"x{i}", value)
            if into is None:
                binding.bind_output(f"y{i}", self.device, 0)
            else:
                binding.bind_ortvalue_output(f"y{i}", into[i])
        binding.bind_cpu_input("rows", sources.astype(np.int64))
        session.run_with_iobinding(binding)
        *cross, new_mask = binding.get_outputs() if into is None else into
        return tuple(cross), new_mask

    def gather_rows(self, pairs: list[tuple[int, int, tuple[int, int, int]]], rows: np.ndarray) -> None:
        """For each (source address, target address, (outer, old rows, inner)): the rows `rows` of the source
        viewed as (outer, old rows, inner) into the target's first (outer, len(rows), inner) elements."""
        binding = self._gather_rows.io_binding()
        for i, (source, target, (outer, old_rows, inner)) in enumerate(pairs):
            binding.bind_input(f"x{i}", self.device, 0, self.element, (outer, old_rows, inner), source)
            binding.bind_output(f"y{i}", self.device, 0, self.element, (outer, len(rows), inner), target)
        binding.bind_cpu_input("rows", np.asarray(rows, np.int64))
        self._gather_rows.run_with_iobinding(binding)


@dataclass
class PingPong:
    """Two buffer sets for `rows` rows of every layer's self-attention cache. A set holds one flat allocation
    per kind (keys, values); a kind's cache tensors lie at its front, layer after layer, each a dense (rows, nh,
    positions, d) tensor, so all layers' rows move with one gather per kind. `positions` is the set's layout:
    the device backend's fixed capacity, or TensorRT's current length (its engines take dense tensors)."""

    memory: DeviceMemory
    sets: tuple[list[ort.OrtValue], list[ort.OrtValue]]
    rows: int
    layers: int
    heads: int
    sizes: tuple[int, int]  # head size per kind: d_k, d_v
    capacity: int  # positions the sets were allocated for
    current: int = 0

    @classmethod
    def allocate(cls, memory: DeviceMemory, rows: int, layers: int, heads: int, sizes: tuple[int, int],
                 positions: int) -> PingPong:
        """Both sets, zeros (the step graph reads unfilled positions: they must be finite), for at most
        `positions` positions."""
        sets = tuple([memory.zeros((layers * rows, heads, positions, d)) for d in sizes] for _ in range(2))
        return cls(memory, sets, rows, layers, heads, sizes, positions)

    def tensors(self, side: int, positions: int, rows: int | None = None) -> list[tuple[int, tuple[int, ...]]]:
        """Address and shape of each cache tensor of a set in the contract's order (per layer key, value), laid out
        for `positions` positions and `rows` rows (default: all)."""
        rows = self.rows if rows is None else rows
        itemsize = self.memory.dtype.itemsize
        out = []
        for layer in range(self.layers):
            for kind, size in enumerate(self.sizes):
                shape = (rows, self.heads, positions, size)
                out.append((self.sets[side][kind].data_ptr() + layer * int(np.prod(shape)) * itemsize, shape))
        return out

    def gather(self, rows: np.ndarray, positions: int, into: PingPong | None = None) -> None:
        """Row i of the cache becomes row rows[i], gathered from the current set into the other one, which
        becomes current and holds len(rows) rows; or into `into`'s first set, which becomes its current one."""
        target = into.sets[0] if into is not None else self.sets[1 - self.current]
        self.memory.gather_rows([(self.sets[self.current][kind].data_ptr(), target[kind].data_ptr(),
                                  (self.layers, self.rows, self.heads * positions * size))
                                 for kind, size in enumerate(self.sizes)], rows)
        if into is None:
            self.current, self.rows = 1 - self.current, len(rows)
        else:
            into.current = 0

    def grow_into(self, wider: PingPong, positions: int) -> None:
        """This cache (laid out for `positions` positions) padded into `wider`'s first set, laid out for its own
        capacity: the same rows, zeros at the new positions; that set becomes `wider`'s current one."""
        for kind, size in enumerate(self.sizes):
            shape = (self.layers * self.rows, self.heads, positions, size)
            self.memory.padded((self.sets[self.current][kind].data_ptr(), shape), wider.capacity,
                               into=wider.sets[0][kind].data_ptr())
        wider.current = 0

    def flip(self) -> None:
        """The other set is current (TensorRT wrote the grown cache there)."""
        self.current = 1 - self.current
