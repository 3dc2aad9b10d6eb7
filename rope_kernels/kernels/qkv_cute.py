"""Kimi's QKV projection with its 2D RoPE in the epilogue: a Hopper (sm_90a) kernel of
our own in CuTe DSL (``nvidia-cutlass-dsl``; optional, imported only when used).

Why a second kernel beside ``qkv_gemm.py``'s Triton one: on the H200 the Triton 3.6
kernel's mainloop needs ~15% more cycles than QuACK's (power-capped GEMMs: cycles a call,
not the clock, decide), and what QuACK does differently (warp specialization on Hopper,
the weight tile multicast over a cluster) is not expressible in Triton 3.6 (see the
comment beside ``QKV_SWEEP_CONFIGS``). This kernel is built from CUTLASS's own
primitives (TMA atoms, WGMMA, mbarrier pipelines, the static persistent tile scheduler),
run from the installed package; the kernel and its epilogue are ours:

- layout: none. W is read as ``nn.Linear`` stores it (N x K, K-major) and the output is
  the packed (T, 3*H*D) row: Kimi's pairs are interleaved (2j, 2j+1) and a WGMMA
  accumulator holds each pair's two columns in one thread's two adjacent registers,
  so the rotation needs no weight permutation and no data movement between threads.
- mainloop: one producer warp (TMA loads of x and W tiles into a ring of shared-memory
  stages; W's tile multicast to the ``cluster_m`` CTAs along M that share it) and two
  consumer warp groups in ping-pong: each owns every other tile of the CTA's persistent
  sequence, so one group's epilogue runs under the other's mainloop; their mainloops
  take turns (two mbarriers), which the stage ring's parity waits need to be right.
- epilogue: bias and rotation on the fp32 accumulator in registers (angles in turns
  from each token's patch (row, column) and a per-pair table, ``rope_pair_table``;
  reduced to [-1/2, 1/2] turn and taken by the SFU's cos/sin.approx, as the Triton
  kernel's ANGLES_FAST), then bf16/fp16 through shared memory to TMA stores in
  (64, ``store_cols``) subtiles. Tiles wholly in v (columns >= 2*H*D) skip the rotation.

Its H200 times (with the rotation and compiled out, beside cuBLAS and QuACK) are the study's
rows in ``data/nvidia-h200/qkv_gemm.csv`` (notebook 05); README's findings quote them.
"""

import math
from dataclasses import dataclass

import torch

TILE_M = 128          # one consumer warp group's tile: two m64 WGMMA rows
TILE_K = 64           # 128 bytes of bf16: the 128-byte swizzle
_EPI_STAGES = 2       # shared-memory store buffers per consumer warp group
_SMEM_BYTES = 232448  # sm_90's shared memory a block may use (227 KB)


@dataclass(frozen=True)
class CuteQKVConfig:
    """Launch settings of ``qkv_rope_linear_cute``."""
    tile_n: int = 192       # columns a tile (Kimi's 3456 = 18 tiles; q|k = the first 12)
    cluster_m: int = 2      # CTAs along M sharing (multicasting) one W tile: 1 or 2
    epi_n: int = 0          # columns of one epilogue store subtile; 0: the widest of 64, 32
                            # and 16 that divides tile_n (64 measured fastest at 192)
    stages: int = 0         # shared-memory stages of (x, W) k-tiles; 0: as many as fit
    rotate: bool = True     # False: rotation compiled out (benchmarks only)
    consumers: int = 2      # consumer warp groups taking turns (2: ping-pong; 1: one)
    raster_m: bool = False  # tile order: False walks N first (a row block of x stays in L2
                            # while every W tile passes), True walks M first

    @classmethod
    def parse(cls, spec: str) -> "CuteQKVConfig":
        """``tile_n x cluster_m`` with optional ``/e<epi_n>``, ``/s<stages>``, ``/c1`` (one
        consumer group), ``/m`` (raster along M): e.g. ``192x2``, ``160x1/e32/m``."""
        head, *opts = spec.strip().split("/")
        try:
            n, m = (int(v) for v in head.split("x"))
        except ValueError:
            raise ValueError(f"CuTe config {spec!r}: expected tile_n x cluster_m, e.g. 192x2")
        kw = {"tile_n": n, "cluster_m": m}
        for o in opts:
            if o == "m":
                kw["raster_m"] = True
            elif o[:1] in ("e", "s", "c") and o[1:].isdigit():
                kw[{"e": "epi_n", "s": "stages", "c": "consumers"}[o[0]]] = int(o[1:])
            else:
                raise ValueError(f"CuTe config {spec!r}: unknown option {o!r}")
        return cls(**kw)

    @property
    def label(self) -> str:
        d = CuteQKVConfig()
        opts = "".join(f"/{k}{getattr(self, n)}" for k, n in (("e", "epi_n"), ("s", "stages"),
                                                                ("c", "consumers"))
                       if getattr(self, n) != getattr(d, n))
        return f"{self.tile_n}x{self.cluster_m}{opts}{'/m' if self.raster_m else ''}"

    def __post_init__(self):
        for name in ("tile_n", "cluster_m", "epi_n", "stages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"CuteQKVConfig.{name} must be an int, got {type(v).__name__}")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"CuteQKVConfig.tile_n must be a multiple of 16 in 16..256, "
                             f"got {self.tile_n}")
        if self.cluster_m not in (1, 2):
            raise ValueError(f"CuteQKVConfig.cluster_m must be 1 or 2, got {self.cluster_m}")
        if self.epi_n not in (0, 16, 32, 64) or (self.epi_n and self.tile_n % self.epi_n):
            raise ValueError(f"CuteQKVConfig.epi_n must be 0 (auto), or 16, 32 or 64 dividing "
                             f"tile_n ({self.tile_n}), got {self.epi_n}")
        if self.stages < 0 or self.stages == 1:
            raise ValueError(f"CuteQKVConfig.stages must be 0 (as many as fit) or >= 2, "
                             f"got {self.stages}")
        if self.consumers not in (1, 2) or isinstance(self.consumers, bool):
            raise ValueError(f"CuteQKVConfig.consumers must be 1 or 2, got {self.consumers!r}")
        for name in ("rotate", "raster_m"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"CuteQKVConfig.{name} must be a bool")

    @property
    def store_cols(self) -> int:
        """Columns of one epilogue store subtile (``epi_n``, or its automatic choice)."""
        return self.epi_n or next(c for c in (64, 32, 16) if self.tile_n % c == 0)

    def ab_stages(self, elem_bytes: int = 2) -> int:
        """The (x, W) stages that fit beside the epilogue buffers (or ``stages``)."""
        per_stage = (TILE_M + self.tile_n) * TILE_K * elem_bytes
        epi = 2 * _EPI_STAGES * 64 * self.store_cols * elem_bytes
        fit = (_SMEM_BYTES - epi - 1024) // per_stage
        if self.stages:
            if self.stages > fit:
                raise ValueError(f"CuteQKVConfig.stages={self.stages} does not fit: at most "
                                 f"{fit} stages of {per_stage} bytes at tile_n={self.tile_n}")
            return self.stages
        return fit


# The configs the study times (notebook 05 keeps the fastest of the run and records the others
# in qkv_gemm_sweep.csv). The three fastest of an H200 exploration (tools/qkv_sweep.py --cute,
# 2026-12-04, Kimi's 21,904 / 43,808 / 87,616 tokens; time over the fastest: 192x2 1.00-1.01x,
# 192x2 with 64-column stores 1.00-1.03x, 160x2 1.01-1.04x; 128x2 1.03-1.13x, 192x1
# 1.06-1.08x, M-first order 1.13-1.23x, one consumer group 1.43-1.83x). The default stores
# 64 columns at a time (fastest by 1-2% in notebook 05's runs) although ptxas 13.0 reports
# 24 bytes of spill stores for it where the 32-column stores have none.
CUTE_CONFIGS = (CuteQKVConfig(), CuteQKVConfig(epi_n=32), CuteQKVConfig(tile_n=160))


def available() -> bool:
    """Whether CuTe DSL imports here (the kernel itself also needs an sm_90 GPU)."""
    try:
        import cutlass  # noqa: F401
        import cutlass.cute  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return True


def cutlass_dsl_version() -> str:
    """The installed nvidia-cutlass-dsl's version ("" where it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("nvidia-cutlass-dsl")
    except PackageNotFoundError:
        return ""


def availability(device=None) -> tuple[bool, str]:
    """(runs here, why not): the kernel needs an sm_90 GPU and nvidia-cutlass-dsl."""
    if not torch.cuda.is_available():
        return False, "needs an NVIDIA sm_90 GPU (no CUDA device here)"
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type != "cuda" or getattr(torch.version, "hip", None):
        return False, "needs an NVIDIA sm_90 GPU"
    major, minor = torch.cuda.get_device_capability(dev)
    if major != 9:
        return False, f"needs an NVIDIA sm_90 GPU (this one is sm_{major}{minor})"
    if not available():
        return False, "nvidia-cutlass-dsl (CuTe DSL) is not installed"
    return True, ""


def rope_pair_table(heads: int, head_dim: int, freqs: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """(3*H*D/2, 4) fp32, one row per column pair p of the packed (q | k | v) row:
    [turns per patch row, turns per patch column, bias of column 2p, bias of 2p+1].

    Kimi's 2D RoPE: within a head, pair j = 2i turns by column * f_i and pair 2i+1 by
    row * f_i (``vision_rope_frequencies``; the Triton kernel's ``_cos_sin``); the
    kernel's angle is row * t[p, 0] + column * t[p, 1] turns, so one of the two is zero
    on every pair, and both on v's pairs. Built once where the weights are loaded."""
    if head_dim % 4:
        raise ValueError(f"head_dim must be a multiple of 4 (interleaved 2D pairs), got {head_dim}")
    if tuple(freqs.shape) != (head_dim // 4,):
        raise ValueError(f"freqs must have shape (head_dim/4,) = ({head_dim // 4},), "
                         f"got {tuple(freqs.shape)}")
    pairs = head_dim // 2
    dev = freqs.device
    turns = freqs.detach().to(torch.float64) / (2 * math.pi)
    j = torch.arange(pairs, device=dev)
    zero = torch.zeros((), dtype=torch.float64, device=dev)
    row = torch.where(j % 2 == 1, turns[j // 2], zero)  # odd pairs: the patch row
    col = torch.where(j % 2 == 0, turns[j // 2], zero)  # even pairs: the patch column
    table = torch.zeros(3, heads, pairs, 4, dtype=torch.float64, device=dev)
    table[:2, :, :, 0] = row
    table[:2, :, :, 1] = col
    if bias is not None:
        if tuple(bias.shape) != (3 * heads * head_dim,):
            raise ValueError(f"bias must have shape (3*heads*head_dim,) = ({3 * heads * head_dim},), "
                             f"got {tuple(bias.shape)}")
        table[..., 2:] = bias.detach().to(device=dev, dtype=torch.float64).view(3, heads, pairs, 2)
    return table.view(3 * heads * pairs, 4).to(torch.float32)


_COMPILED: dict = {}


def _kernel_class():
    """The kernel class, defined on first use (CuTe DSL imports only then)."""
    if "cls" in _COMPILED:
        return _COMPILED["cls"]
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90
    from cutlass import Float32, Int32
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    def _ptx_f32(op: str, x):
        return Float32(llvm.inline_asm(T.f32(), [Float32(x).ir_value()], f"{op} $0, $1;",
                                       "=f,f", has_side_effects=False, is_align_stack=False))

    @cute.jit
    def _turn(x0, x1, turns):
        """(x0, x1) turned by ``turns`` (fp32, any size): reduced to [-1/2, 1/2] turn
        (cvt.rni), then the SFU's cos/sin of it in radians."""
        reduced = (turns - _ptx_f32("cvt.rni.f32.f32", turns)) * 6.283185307179586
        c = _ptx_f32("cos.approx.ftz.f32", reduced)
        s = _ptx_f32("sin.approx.ftz.f32", reduced)
        return x0 * c - x1 * s, x0 * s + x1 * c

    class KimiQKVRopeSm90:
        def __init__(self, cfg: CuteQKVConfig, rot_cols: int, has_bias: bool, elem_bytes: int):
            self.cfg = cfg
            self.tile_n = cfg.tile_n
            self.tile_shape = (TILE_M, cfg.tile_n, TILE_K)
            self.cluster_shape = (cfg.cluster_m, 1)
            self.rot_cols = rot_cols
            self.has_bias = has_bias
            self.rotate = cfg.rotate
            self.ab_stages = cfg.ab_stages(elem_bytes)
            self.epi_tile = (64, cfg.store_cols)
            self.consumers = cfg.consumers
            self.threads = 3 * 128  # producer warp group + two consumer warp groups

        @cute.jit
        def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor,
                     mTab: cute.Tensor, mCoords: cute.Tensor,
                     max_active_clusters: cutlass.Constexpr, stream):
            dtype = mX.element_type
            self.dtype = dtype
            row_major = utils.LayoutEnum.ROW_MAJOR
            tiled_mma = sm90.make_trivial_tiled_mma(
                dtype, dtype, cute.nvgpu.warpgroup.OperandMajorMode.K,
                cute.nvgpu.warpgroup.OperandMajorMode.K, Float32, (1, 1, 1),
                tiler_mn=(64, self.tile_n))
            a_layout = sm90.make_smem_layout_a(row_major, self.tile_shape, dtype, self.ab_stages)
            b_layout = sm90.make_smem_layout_b(row_major, self.tile_shape, dtype, self.ab_stages)
            epi_layout = sm90.make_smem_layout_epi(dtype, row_major, self.epi_tile,
                                                   2 * _EPI_STAGES)
            # W's tile is multicast to the cluster's CTAs along M (they share it)
            b_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp()
                    if self.cluster_shape[0] > 1 else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
            tma_x, gX = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mX,
                cute.slice_(a_layout, (None, None, 0)), (TILE_M, TILE_K))
            tma_w, gW = cute.nvgpu.cpasync.make_tiled_tma_atom(
                b_op, mW, cute.slice_(b_layout, (None, None, 0)), (self.tile_n, TILE_K),
                num_multicast=self.cluster_shape[0])
            tma_out, gOut = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mOut,
                cute.slice_(epi_layout, (None, None, 0)), self.epi_tile)

            tiles = cute.zipped_divide(mOut, (TILE_M, self.tile_n))
            tiles_mn = tiles[(0, (None, None))].shape
            sched = utils.PersistentTileSchedulerParams(
                (*tiles_mn, 1), (*self.cluster_shape, 1), 1, self.cfg.raster_m)
            grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, max_active_clusters)

            @cute.struct
            class Storage:
                bars: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
                turns: cute.struct.MemRange[cutlass.Int64, 2]  # consumer groups' mainloop turns
                sX: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(a_layout)], 1024]
                sW: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(b_layout)], 1024]
                sOut: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(epi_layout)],
                                        1024]

            self.storage = Storage
            self.kernel(tma_x, gX, tma_w, gW, tma_out, gOut, mTab, mCoords, tiled_mma,
                        a_layout, b_layout, epi_layout, sched).launch(
                grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster_shape, 1),
                min_blocks_per_mp=1, stream=stream)

        @cute.kernel
        def kernel(self, tma_x: cute.CopyAtom, gX: cute.Tensor, tma_w: cute.CopyAtom,
                   gW: cute.Tensor, tma_out: cute.CopyAtom, gOut: cute.Tensor,
                   mTab: cute.Tensor, mCoords: cute.Tensor, tiled_mma: cute.TiledMma,
                   a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout,
                   epi_layout: cute.ComposedLayout,
                   sched_params: utils.PersistentTileSchedulerParams):
            tidx, _, _ = cute.arch.thread_idx()
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            group = cute.arch.make_warp_uniform(tidx // 128)  # 0 producer, 1-2 consumers
            if warp == 0:
                cute.nvgpu.cpasync.prefetch_descriptor(tma_x)
                cute.nvgpu.cpasync.prefetch_descriptor(tma_w)
                cute.nvgpu.cpasync.prefetch_descriptor(tma_out)

            cta_layout = cute.make_layout((*self.cluster_shape, 1))
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            cluster_coord = cta_layout.get_flat_coord(rank)
            w_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=0)

            smem = cutlass.utils.SmemAllocator()
            st = smem.allocate(self.storage)
            stage_bytes = (cute.size_in_bytes(self.dtype, cute.slice_(a_layout, (None, None, 0)))
                           + cute.size_in_bytes(self.dtype, cute.slice_(b_layout, (None, None, 0))))
            # a stage is read by one consumer warp group (4 warps) in each CTA it went to
            ring = pipeline.PipelineTmaAsync.create(
                barrier_storage=st.bars.data_ptr(), num_stages=self.ab_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                         4 * self.cluster_shape[0]),
                tx_count=stage_bytes, cta_layout_vmnk=cute.make_layout((1, *cta_layout.shape)))
            turns = st.turns.data_ptr()
            if tidx == 0:
                cute.arch.mbarrier_init(turns, 128)
                cute.arch.mbarrier_init(turns + 1, 128)
            cute.arch.mbarrier_init_fence()
            if cute.size(self.cluster_shape) > 1:
                cute.arch.cluster_arrive_relaxed()

            sX = st.sX.get_tensor(a_layout.outer, swizzle=a_layout.inner)
            sW = st.sW.get_tensor(b_layout.outer, swizzle=b_layout.inner)
            sOut = st.sOut.get_tensor(epi_layout.outer, swizzle=epi_layout.inner)

            # (bM, bK, tiles M, tiles K), (bN, bK, tiles N, tiles K), (bM, bN, tiles M, tiles N)
            tX = cute.local_tile(gX, (TILE_M, TILE_K), (None, None))
            tW = cute.local_tile(gW, (self.tile_n, TILE_K), (None, None))
            tOut = cute.local_tile(gOut, (TILE_M, self.tile_n), (None, None))
            k_tiles = cute.size(tX, mode=[3])

            x_s, x_g = cute.nvgpu.cpasync.tma_partition(
                tma_x, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2),
                cute.group_modes(tX, 0, 2))
            w_s, w_g = cute.nvgpu.cpasync.tma_partition(
                tma_w, cluster_coord[0], cute.make_layout(self.cluster_shape[0]),
                cute.group_modes(sW, 0, 2), cute.group_modes(tW, 0, 2))

            if cute.size(self.cluster_shape) > 1:
                cute.arch.cluster_wait()
            else:
                cute.arch.sync_threads()

            if group == 0:
                cute.arch.warpgroup_reg_dealloc(40)
                if warp == 0:
                    self.produce(ring, tma_x, tma_w, x_s, x_g, w_s, w_g, w_mask, k_tiles,
                                 sched_params)
            elif group <= self.consumers:
                cute.arch.warpgroup_reg_alloc(232)
                self.consume(group - 1, tidx - 128 * group, ring, turns, tiled_mma, sX, sW,
                             sOut, tma_out, tOut, mTab, mCoords, k_tiles, sched_params)

        @cute.jit
        def produce(self, ring, tma_x, tma_w, x_s, x_g, w_s, w_g, w_mask, k_tiles,
                    sched_params):
            """The producer warp: every tile of this CTA's sequence, k-tile by k-tile."""
            sched = utils.StaticPersistentTileScheduler.create(
                sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
            work = sched.initial_work_tile_info()
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                 self.ab_stages)
            while work.is_valid_tile:
                m_t, n_t, _ = work.tile_idx
                for k in range(k_tiles):
                    ring.producer_acquire(state)
                    bar = ring.producer_get_barrier(state)
                    cute.copy(tma_x, x_g[(None, m_t, k)], x_s[(None, state.index)],
                              tma_bar_ptr=bar)
                    cute.copy(tma_w, w_g[(None, n_t, k)], w_s[(None, state.index)],
                              tma_bar_ptr=bar, mcast_mask=w_mask)
                    ring.producer_commit(state)
                    state.advance()
                sched.advance_to_next_work()
                work = sched.get_current_work()
            ring.producer_tail(state)

        @cute.jit
        def consume(self, me, t, ring, turns, tiled_mma, sX, sW, sOut, tma_out, tOut, mTab,
                    mCoords, k_tiles, sched_params):
            """Consumer warp group ``me`` (0/1), thread ``t`` in it: tiles me, me+2, ...
            of the CTA's sequence; mainloop, then the epilogue under the other group's.
            The two groups' mainloops take turns (mbarriers ``turns``: a group starts its
            mainloop once the other has waited for all of its k-tiles). This is needed
            for correctness, not only speed: a stage's full barrier is waited on by its
            phase parity, which tells one phase from the next only; without the turns
            group 1 would wait for a fill several phases ahead and pass at once."""
            thr_mma = tiled_mma.get_slice(t)
            frag_x = tiled_mma.make_fragment_A(thr_mma.partition_A(sX))
            frag_w = tiled_mma.make_fragment_B(thr_mma.partition_B(sW))
            acc = cute.make_rmem_tensor(thr_mma.partition_C(tOut[(None, None, 0, 0)]).shape[:3],
                                        Float32)
            coord = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, self.tile_n)))
            k_blocks = cute.size(frag_x, mode=[2])

            # epilogue: accumulator -> registers (bf16) -> shared (stmatrix) -> TMA store
            r2s = cute.make_tiled_copy_S(
                sm90.get_smem_store_op(utils.LayoutEnum.ROW_MAJOR, sOut.element_type, Float32),
                cute.make_tiled_copy_C_atom(
                    cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4),
                                        sOut.element_type), tiled_mma))
            thr_r2s = r2s.get_slice(t)
            r2s_s = thr_r2s.partition_D(sOut)
            r2s_acc = r2s.retile(acc)
            sub_shape = cute.shape(thr_r2s.partition_S(sOut))[:3]
            sub_f32 = cute.make_rmem_tensor(sub_shape, Float32)
            sub_out = cute.make_rmem_tensor(sub_shape, sOut.element_type)
            sub_size = cute.size(sub_f32)
            bar = pipeline.NamedBarrier(barrier_id=1 + me, num_threads=128)
            stores = pipeline.PipelineTmaStore.create(
                num_stages=_EPI_STAGES,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128))
            store_warp = t // 32 == 0

            sched = utils.StaticPersistentTileScheduler.create(
                sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                self.ab_stages)
            groups = self.consumers
            if cutlass.const_expr(groups > 1):
                # group 1 starts at the CTA's second tile and its first k-tile
                sched.advance_to_next_work(advance_count=me)
                read.advance(k_tiles * me)
            release = read.clone()
            work = sched.get_current_work()
            subtiles = 0
            turn_phase = Int32(me == 0)  # group 0's first turn is given
            while work.is_valid_tile:
                m_t, n_t, _ = work.tile_idx
                if cutlass.const_expr(groups > 1):
                    cute.arch.mbarrier_wait(turns + me, turn_phase)
                    turn_phase ^= 1
                # mainloop: one WGMMA batch in flight, its stage released a k-tile later
                acc.fill(0.0)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.fence()
                for k in range(k_tiles):
                    ring.consumer_wait(read)
                    for kb in cutlass.range_constexpr(k_blocks):
                        cute.gemm(tiled_mma, acc, frag_x[(None, None, kb, read.index)],
                                  frag_w[(None, None, kb, read.index)], acc)
                    cute.nvgpu.warpgroup.commit_group()
                    if k > 0:
                        cute.nvgpu.warpgroup.wait_group(1)
                        ring.consumer_release(release)
                        release.advance()
                    read.advance()
                if cutlass.const_expr(groups > 1):
                    cute.arch.mbarrier_arrive(turns + (1 - me))  # the other group's turn
                cute.nvgpu.warpgroup.wait_group(0)
                ring.consumer_release(release)
                release.advance()
                if cutlass.const_expr(groups > 1):
                    # the other group's tile: its k-tiles are not ours
                    read.advance(k_tiles)
                    release.advance(k_tiles)

                m0 = m_t * TILE_M
                n0 = n_t * self.tile_n
                self.bias_and_rotate(acc, coord, m0, n0, mTab, mCoords)

                out_tile = cute.zipped_divide(tOut[(None, None, m_t, n_t)], self.epi_tile)
                s_part, g_part = cute.nvgpu.cpasync.tma_partition(
                    tma_out, 0, cute.make_layout(1), cute.group_modes(sOut, 0, 2), out_tile)
                n_subs = cute.size(out_tile, mode=[1])
                sub_grid = cute.make_layout(out_tile.shape[1], stride=(out_tile.shape[1][1], 1))
                for e in cutlass.range_constexpr(n_subs):
                    for v in cutlass.range_constexpr(sub_size):
                        sub_f32[v] = r2s_acc[e * sub_size + v]
                    sub_out.store(sub_f32.load().to(sOut.element_type))
                    buf = me * _EPI_STAGES + (subtiles + e) % _EPI_STAGES
                    cute.copy(r2s, sub_out, r2s_s[(None, None, None, buf)])
                    cute.arch.fence_proxy("async.shared", space="cta")
                    bar.arrive_and_wait()
                    if store_warp:
                        cute.copy(tma_out, s_part[(None, buf)],
                                  g_part[(None, sub_grid.get_hier_coord(e))])
                        stores.producer_commit()
                        stores.producer_acquire()
                    bar.arrive_and_wait()
                subtiles += n_subs
                sched.advance_to_next_work(advance_count=groups)
                work = sched.get_current_work()
            if store_warp:
                stores.producer_tail()

        @cute.jit
        def bias_and_rotate(self, acc, coord, m0, n0, mTab, mCoords):
            """Bias, then Kimi's rotation, on the fp32 accumulator in place. WGMMA's C
            fragment is ((2 columns, 2 rows, tile_n/8 column groups), m64 blocks, 1): a
            pair's two columns sit in one thread's two adjacent registers. Each thread
            reads the positions of its 4 rows once and the table row of each of its
            column pairs once."""
            if cutlass.const_expr(self.has_bias or self.rotate):
                groups = cute.size(acc, mode=[0, 2])
                blocks = cute.size(acc, mode=[1])
                rotated = n0 < self.rot_cols  # wholly-v tiles: bias only
                last = mCoords.shape[0] - 1
                pos_r = []
                pos_c = []
                if cutlass.const_expr(self.rotate):
                    for mi in cutlass.range_constexpr(blocks):
                        for r in cutlass.range_constexpr(2):
                            row = cutlass.min(m0 + coord[((0, r, 0), mi, 0)][0], last)
                            pos_r.append(Float32(mCoords[row, 0]))
                            pos_c.append(Float32(mCoords[row, 1]))
                for g in cutlass.range_constexpr(groups):
                    p = (n0 + coord[((0, 0, g), 0, 0)][1]) // 2
                    if cutlass.const_expr(self.has_bias):
                        b0 = mTab[p, 2]
                        b1 = mTab[p, 3]
                    if cutlass.const_expr(self.rotate):
                        fr = mTab[p, 0]
                        fc = mTab[p, 1]
                    for mi in cutlass.range_constexpr(blocks):
                        for r in cutlass.range_constexpr(2):
                            i0 = ((0, r, g), mi, 0)
                            i1 = ((1, r, g), mi, 0)
                            x0 = acc[i0]
                            x1 = acc[i1]
                            if cutlass.const_expr(self.has_bias):
                                x0 = x0 + b0
                                x1 = x1 + b1
                            if cutlass.const_expr(self.rotate):
                                if rotated:
                                    x0, x1 = _turn(x0, x1, pos_r[2 * mi + r] * fr
                                                   + pos_c[2 * mi + r] * fc)
                            acc[i0] = x0
                            acc[i1] = x1

    _COMPILED["cls"] = KimiQKVRopeSm90
    return KimiQKVRopeSm90


def _cute_tensor(t: torch.Tensor, dynamic_rows: bool):
    from cutlass.cute.runtime import from_dlpack
    ct = from_dlpack(t.detach(), assumed_align=16)
    if dynamic_rows:
        ct = ct.mark_compact_shape_dynamic(mode=0, stride_order=(0, 1), divisibility=1)
    return ct


def compile_kernel(cfg: CuteQKVConfig, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                   table: torch.Tensor, coords: torch.Tensor, rot_cols: int, has_bias: bool,
                   max_active_clusters: int, stream=None):
    """Compile (or fetch) the kernel for these dtypes, widths and settings; the token
    count is a runtime value. Tensors may live on the CPU: compiling needs no GPU
    (``CUTE_DSL_ARCH=sm_90a`` names the target where there is none)."""
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    key = (cfg, x.dtype, tuple(w.shape), rot_cols, has_bias, max_active_clusters)
    if key not in _COMPILED:
        kernel = _kernel_class()(cfg, rot_cols, has_bias, x.element_size())
        _COMPILED[key] = cute.compile(
            kernel, _cute_tensor(x, True), _cute_tensor(w, False), _cute_tensor(out, True),
            _cute_tensor(table, False), _cute_tensor(coords, True), max_active_clusters,
            stream if stream is not None else cuda.CUstream(0))
    return _COMPILED[key]


def qkv_rope_linear_cute(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    table: torch.Tensor,
    coords: torch.Tensor,
    *,
    heads: int,
    head_dim: int,
    has_bias: bool = True,
    config: CuteQKVConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rope(x @ w_qkv^T + b_qkv)`` in one CuTe DSL kernel (sm_90): packed (T, 3, H, D).

    Args:
        x: (T, hidden) bf16/fp16, contiguous; hidden a multiple of 8.
        w_qkv: (3*H*D, hidden), contiguous, x's dtype (``nn.Linear``'s layout as is).
        table: ``rope_pair_table(heads, head_dim, freqs, b_qkv)`` (built once).
        coords: int32 (T, 2) contiguous, each token's (row, column) in its patch grid.
        has_bias: False skips the table's bias columns (a layer without bias).
        config: launch settings (``CuteQKVConfig()`` by default).
        out: optional preallocated (T, 3, H, D) contiguous output.
    """
    from rope_kernels.kernels.qkv_gemm import _check_common, _check_out

    cfg = config if config is not None else CuteQKVConfig()
    if not isinstance(cfg, CuteQKVConfig):
        raise TypeError(f"config must be a CuteQKVConfig, got {type(cfg).__name__}")
    # x and W as the Triton kernel's launcher checks them (dtype, shapes, device)
    w_heads, _ = _check_common(x, w_qkv, None, head_dim, "head_dim")
    if w_heads != heads:
        raise ValueError(f"w_qkv has {w_heads} heads of {head_dim}, not heads={heads}")
    if head_dim % 4:
        raise ValueError(f"head_dim must be a multiple of 4 (Kimi's interleaved 2D pairs), "
                         f"got {head_dim}")
    for name, t in (("x", x), ("w_qkv", w_qkv), ("table", table), ("coords", coords)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_contiguous():  # the compiled kernel assumes compact rows
            raise ValueError(f"{name} must be contiguous")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    n_cols = 3 * heads * head_dim
    if x.shape[1] % 8 or x.shape[0] < 1:
        raise ValueError(f"x must be (tokens >= 1, hidden) with hidden a multiple of 8 "
                         f"(16-byte TMA rows), got {tuple(x.shape)}")
    if table.dtype != torch.float32 or tuple(table.shape) != (n_cols // 2, 4):
        raise ValueError(f"table must be rope_pair_table's fp32 ({n_cols // 2}, 4), got "
                         f"{table.dtype} {tuple(table.shape)}")
    if coords.dtype != torch.int32 or tuple(coords.shape) != (x.shape[0], 2):
        raise ValueError(f"coords must be int32 (tokens, 2) = ({x.shape[0]}, 2), got "
                         f"{coords.dtype} {tuple(coords.shape)}")
    shape = (x.shape[0], 3, heads, head_dim)
    if out is not None:  # as the Triton launcher checks it: shape, dtype, no overlap with inputs
        _check_out(out, shape, x, {"x": x, "w_qkv": w_qkv, "table": table, "coords": coords})
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device)[0] != 9:
        raise ValueError("qkv_rope_linear_cute runs on sm_90 GPUs (Hopper) only")
    if out is None:
        out = torch.empty(shape, device=x.device, dtype=x.dtype)
    out2d = out.view(x.shape[0], n_cols)
    for name, t in (("x", x), ("w_qkv", w_qkv), ("table", table), ("coords", coords), ("out", out)):
        if t.data_ptr() % 16:  # TMA and the compiled kernel assume 16-byte aligned bases
            raise ValueError(f"{name} must start at a 16-byte aligned address (a view with an "
                             f"offset is not; pass a copy)")
    import cuda.bindings.driver as cuda
    clusters = _max_clusters(cfg.cluster_m)
    stream = cuda.CUstream(torch.cuda.current_stream(x.device).cuda_stream)
    fn = compile_kernel(cfg, x, w_qkv, out2d, table, coords, 2 * heads * head_dim, has_bias,
                        clusters, stream)
    fn(_cute_tensor(x, True), _cute_tensor(w_qkv, False), _cute_tensor(out2d, True),
       _cute_tensor(table, False), _cute_tensor(coords, True), stream)
    return out


def _max_clusters(cluster_m: int) -> int:
    key = ("clusters", cluster_m)
    if key not in _COMPILED:
        import cutlass.utils
        _COMPILED[key] = cutlass.utils.HardwareInfo().get_max_active_clusters(cluster_m)
    return _COMPILED[key]


def _version_key(t: torch.Tensor | None):
    """What identifies a tensor's contents without reading them: its storage and, where
    torch tracks it (not for inference tensors), its in-place version counter."""
    if t is None:
        return None
    try:
        return (t.data_ptr(), t._version)
    except RuntimeError:  # an inference tensor: no version counter
        return (t.data_ptr(),)


def rotating_qkv_projection_cute(linear: torch.nn.Linear, h: torch.Tensor, coords: torch.Tensor,
                                 heads: int, head_dim: int, *, theta: float = 10000.0,
                                 config: CuteQKVConfig | None = None) -> torch.Tensor:
    """``linear(h)`` as packed (T, 3, H, D) with q and k rotated, by ``qkv_rope_linear_cute``:
    the encoder's ``gemm_epilogue_cute``. The per-pair table (Kimi's frequencies at
    ``theta`` and this layer's bias) is built at the first call and kept on the module, as
    a model would at load; it is rebuilt when the weight or bias is replaced or changed in
    place (their version counters; tensors made under inference mode have none, so
    there only a replaced tensor is seen)."""
    from rope_kernels.kernels.freqs import vision_rope_frequencies

    bias = linear.bias
    key = (_version_key(linear.weight), _version_key(bias), heads, head_dim, float(theta))
    cached = getattr(linear, "_rope_pair_table", None)
    if cached is None or cached[0] != key:
        freqs = vision_rope_frequencies(head_dim, theta=theta, device=linear.weight.device)
        cached = (key, rope_pair_table(heads, head_dim, freqs, bias))
        linear._rope_pair_table = cached
    return qkv_rope_linear_cute(h, linear.weight, cached[1], coords, heads=heads,
                                head_dim=head_dim, has_bias=bias is not None, config=config)
