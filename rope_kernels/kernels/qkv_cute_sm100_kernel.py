"""The CuTe DSL kernel of ``qkv_cute_sm100.py`` (Blackwell, sm_100a): Kimi's QKV projection
with its 2D RoPE in the epilogue, on UMMA (``tcgen05.mma``) with the accumulator in tensor
memory. This module imports CuTe DSL at the top and builds tcgen05 operations, which CuTe DSL
admits only when its target (``CUTE_DSL_ARCH``) is an sm_100 family one: it is imported by
``qkv_cute_sm100.compile_kernel`` only, in a process whose target is sm_100a.

One CTA per (128 x tile_n) output tile, 4 warps, no cluster:
- warp 0: TMA loads of x and W k-tiles into a ring of shared-memory stages;
- warp 1: the MMA issuer, one ``tcgen05.mma`` (128 x tile_n x 16) per k-block into the fp32
  accumulator in tensor memory, each stage released by a ``tcgen05.commit`` to its barrier;
- all 4 warps, the epilogue: warp w reads tensor-memory lanes 32w..32w+31 (rows of the tile)
  with ``tcgen05.ld.32x32b``, so a thread holds one row and ``store_cols`` consecutive columns
  of it: a pair (2j, 2j+1) sits in two adjacent registers of one thread and one token's patch
  position serves the whole row. Bias and rotation are the sm_90a kernel's (the layer's
  bias read as an operand in its own dtype, the same ``rope_pair_turns`` table, the same
  ``_turn``), then bf16/fp16 through shared memory to TMA stores.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100
from cutlass import Float32
from cutlass.cute.nvgpu import cpasync, tcgen05

from rope_kernels.kernels.qkv_cute_config import EPI_STAGES, TILE_K, TILE_M, CuteQKVConfig
from rope_kernels.kernels.qkv_cute_kernel import _turn

THREADS = 128  # 4 warps: tensor memory's 128 lanes, 32 a warp


def tmem_columns(tile_n: int) -> int:
    """Tensor-memory columns allocated for one fp32 (128 x tile_n) accumulator: a power of
    two, at least 32 (what ``tcgen05.alloc`` takes)."""
    return max(32, 1 << (tile_n - 1).bit_length())


class KimiQKVRopeSm100:
    """The sm_100a kernel: ``KimiQKVRopeSm100(cfg, rot_cols, has_bias, elem_bytes)`` is
    compiled by ``cute.compile(kernel, x, w, out, turns, bias, coords, stream)``
    (``qkv_cute_sm100.compile_kernel``). ``cfg``'s tile_n, store columns, stages and rotate
    are used; it must have ``cluster_m == 1`` (no multicast here). ``bias`` is the layer's
    own (3*H*D,) vector, read in its dtype at every launch (not read where ``has_bias`` is
    False), as in the sm_90a kernel."""

    def __init__(self, cfg: CuteQKVConfig, rot_cols: int, has_bias: bool, elem_bytes: int):
        if cfg.cluster_m != 1:
            raise ValueError(f"the sm_100a kernel runs without a cluster: cluster_m must be 1, "
                             f"got {cfg.cluster_m}")
        self.cfg = cfg
        self.tile_n = cfg.tile_n
        self.mma_tiler = (TILE_M, cfg.tile_n, TILE_K)
        self.epi_tile = (TILE_M, cfg.store_cols)
        self.rot_cols = rot_cols
        self.has_bias = has_bias
        self.rotate = cfg.rotate
        # the sm_90a budget holds here too: its two groups' (64 x cols) store buffers are
        # the bytes of one (128 x cols) buffer pair
        self.ab_stages = cfg.ab_stages(elem_bytes)
        self.tmem_cols = tmem_columns(cfg.tile_n)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor,
                 mTurns: cute.Tensor, mBias: cute.Tensor, mCoords: cute.Tensor, stream):
        dtype = mX.element_type
        self.dtype = dtype
        k_major = tcgen05.OperandMajorMode.K
        tiled_mma = sm100.make_trivial_tiled_mma(dtype, k_major, k_major, Float32,
                                                 tcgen05.CtaGroup.ONE, (TILE_M, self.tile_n))
        a_layout = sm100.make_smem_layout_a(tiled_mma, self.mma_tiler, dtype, self.ab_stages)
        b_layout = sm100.make_smem_layout_b(tiled_mma, self.mma_tiler, dtype, self.ab_stages)
        epi_layout = sm100.make_smem_layout_epi(dtype, utils.LayoutEnum.ROW_MAJOR,
                                                self.epi_tile, EPI_STAGES)
        one_cta = (1, 1, 1, 1)
        a_stage = cute.slice_(a_layout, (None, None, None, 0))
        b_stage = cute.slice_(b_layout, (None, None, None, 0))
        tma_x, gX = cute.nvgpu.make_tiled_tma_atom_A(
            cpasync.CopyBulkTensorTileG2SOp(), mX, a_stage, self.mma_tiler, tiled_mma, one_cta)
        tma_w, gW = cute.nvgpu.make_tiled_tma_atom_B(
            cpasync.CopyBulkTensorTileG2SOp(), mW, b_stage, self.mma_tiler, tiled_mma, one_cta)
        tma_out, gOut = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mOut, cute.slice_(epi_layout, (None, None, 0)),
            self.epi_tile)
        self.stage_bytes = (cute.size_in_bytes(dtype, a_stage)
                            + cute.size_in_bytes(dtype, b_stage))

        tiles = cute.zipped_divide(mOut, (TILE_M, self.tile_n))
        tiles_mn = tiles[(0, (None, None))].shape

        @cute.struct
        class Storage:
            ab_bars: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            acc_bars: cute.struct.MemRange[cutlass.Int64, 2]
            tmem_base: cutlass.Int32  # where tcgen05.alloc writes the accumulator's address
            sX: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(a_layout)], 1024]
            sW: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(b_layout)], 1024]
            sOut: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(epi_layout)],
                                    1024]

        self.storage = Storage
        self.kernel(tma_x, gX, tma_w, gW, tma_out, gOut, mTurns, mBias, mCoords, tiled_mma,
                    a_layout, b_layout, epi_layout).launch(
            grid=(*tiles_mn, 1), block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_x: cute.CopyAtom, gX: cute.Tensor, tma_w: cute.CopyAtom,
               gW: cute.Tensor, tma_out: cute.CopyAtom, gOut: cute.Tensor,
               mTurns: cute.Tensor, mBias: cute.Tensor, mCoords: cute.Tensor,
               tiled_mma: cute.TiledMma,
               a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout,
               epi_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        m_t, n_t, _ = cute.arch.block_idx()
        if warp == 0:
            cpasync.prefetch_descriptor(tma_x)
            cpasync.prefetch_descriptor(tma_w)
            cpasync.prefetch_descriptor(tma_out)

        smem = utils.SmemAllocator()
        st = smem.allocate(self.storage)
        no_cluster = cute.make_layout((1, 1, 1, 1))
        # a stage: filled by TMA (transaction bytes), emptied by the MMA warp's commit
        ring = pipeline.PipelineTmaUmma.create(
            barrier_storage=st.ab_bars.data_ptr(), num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            tx_count=self.stage_bytes, cta_layout_vmnk=no_cluster)
        # the accumulator: complete (MMA commit) -> read by all 128 threads
        acc_done = pipeline.PipelineUmmaAsync.create(
            barrier_storage=st.acc_bars.data_ptr(), num_stages=1,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, THREADS),
            cta_layout_vmnk=no_cluster)
        block_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=THREADS)
        tmem = utils.TmemAllocator(st.tmem_base, barrier_for_retrieve=block_bar)

        sX = st.sX.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        sW = st.sW.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        sOut = st.sOut.get_tensor(epi_layout.outer, swizzle=epi_layout.inner)

        # this CTA's (bM, bK, k-tiles) and (bN, bK, k-tiles), partitioned for the MMA
        tX = cute.local_tile(gX, (TILE_M, TILE_K), (m_t, None))
        tW = cute.local_tile(gW, (self.tile_n, TILE_K), (n_t, None))
        k_tiles = cute.size(tX, mode=[2])
        thr_mma = tiled_mma.get_slice(0)
        x_s, x_g = cpasync.tma_partition(
            tma_x, 0, cute.make_layout(1), cute.group_modes(sX, 0, 3),
            cute.group_modes(thr_mma.partition_A(tX), 0, 3))
        w_s, w_g = cpasync.tma_partition(
            tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 3),
            cute.group_modes(thr_mma.partition_B(tW), 0, 3))
        frag_x = tiled_mma.make_fragment_A(sX)
        frag_w = tiled_mma.make_fragment_B(sW)
        acc_layout = tiled_mma.make_fragment_C(
            tiled_mma.partition_shape_C((TILE_M, self.tile_n))).layout

        cute.arch.sync_threads()
        tmem.allocate(self.tmem_cols)
        tmem.wait_for_alloc()
        acc = cute.make_tensor(tmem.retrieve_ptr(Float32), acc_layout)

        if warp == 0:
            fill = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                self.ab_stages)
            for k in range(k_tiles):
                ring.producer_acquire(fill)
                bar = ring.producer_get_barrier(fill)
                cute.copy(tma_x, x_g[(None, k)], x_s[(None, fill.index)], tma_bar_ptr=bar)
                cute.copy(tma_w, w_g[(None, k)], w_s[(None, fill.index)], tma_bar_ptr=bar)
                ring.producer_commit(fill)
                fill.advance()
        elif warp == 1:
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                self.ab_stages)
            k_blocks = cute.size(frag_x, mode=[2])
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
            for k in range(k_tiles):
                ring.consumer_wait(read)
                for kb in cutlass.range_constexpr(k_blocks):
                    cute.gemm(tiled_mma, acc, frag_x[(None, None, kb, read.index)],
                              frag_w[(None, None, kb, read.index)], acc)
                    tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                ring.consumer_release(read)
                read.advance()
            acc_done.producer_commit(
                pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1))

        tmem.relinquish_alloc_permit()
        acc_done.consumer_wait(pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1))
        self.epilogue(tidx, warp, acc, sOut, tma_out, gOut, m_t, n_t, mTurns, mBias, mCoords,
                      block_bar)

        block_bar.arrive_and_wait()
        tmem.free(acc.iterator)

    @cute.jit
    def epilogue(self, tidx, warp, acc, sOut, tma_out, gOut, m_t, n_t, mTurns, mBias, mCoords,
                 block_bar):
        """Tensor memory -> registers (one row a thread) -> bias and rotation ->
        bf16/fp16 -> shared memory -> TMA stores of (128, store_cols) subtiles."""
        cols = self.epi_tile[1]
        # (128, cols, 1, subtiles) of the accumulator, of the output tile, of coordinates
        acc_epi = cute.flat_divide(acc[((None, None), 0, 0)], self.epi_tile)
        t2r = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.Ld32x32bOp(tcgen05.Repetition(cols)), Float32),
            acc_epi[(None, None, 0, 0)])
        thr_t2r = t2r.get_slice(tidx)
        t2r_acc = thr_t2r.partition_S(acc_epi)
        t2r_coord = thr_t2r.partition_D(cute.flat_divide(
            cute.make_identity_tensor((TILE_M, self.tile_n)), self.epi_tile))
        r_acc = cute.make_rmem_tensor(t2r_coord[(None, None, None, 0, 0)].shape, Float32)
        r_out = cute.make_rmem_tensor(r_acc.shape, self.dtype)

        r2s = cute.make_tiled_copy_D(
            sm100.get_smem_store_op(utils.LayoutEnum.ROW_MAJOR, self.dtype, Float32, t2r), t2r)
        r2s_dst = r2s.get_slice(tidx).partition_D(sOut)
        r2s_src = r2s.retile(r_out)

        out_epi = cute.flat_divide(
            cute.local_tile(gOut, (TILE_M, self.tile_n), (m_t, n_t)), self.epi_tile)
        s_part, g_part = cpasync.tma_partition(
            tma_out, 0, cute.make_layout(1), cute.group_modes(sOut, 0, 2),
            cute.group_modes(out_epi, 0, 2))
        stores = pipeline.PipelineTmaStore.create(
            num_stages=EPI_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, THREADS))

        m0 = m_t * TILE_M
        n0 = n_t * self.tile_n
        for e in cutlass.range_constexpr(cute.size(t2r_acc, mode=[4])):
            cute.copy(t2r, t2r_acc[(None, None, None, 0, e)], r_acc)
            self.bias_and_rotate(r_acc, t2r_coord[(None, None, None, 0, e)], m0, n0,
                                 mTurns, mBias, mCoords)
            r_out.store(r_acc.load().to(self.dtype))
            buf = e % EPI_STAGES
            cute.copy(r2s, r2s_src, r2s_dst[(None, None, None, buf)])
            cute.arch.fence_proxy("async.shared", space="cta")
            block_bar.arrive_and_wait()
            if warp == 0:
                cute.copy(tma_out, s_part[(None, buf)], g_part[(None, 0, e)])
                stores.producer_commit()
                stores.producer_acquire()
            block_bar.arrive_and_wait()
        if warp == 0:
            stores.producer_tail()

    @cute.jit
    def bias_and_rotate(self, r_acc, coord, m0, n0, mTurns, mBias, mCoords):
        """Bias, then Kimi's rotation, on one thread's fp32 registers in place: one row of
        the tile and consecutive columns (``tcgen05.ld.32x32b``), so register 2i and 2i+1 are
        a pair's two columns; the row's patch position is read once. The arithmetic is the
        sm_90a kernel's (``KimiQKVRopeSm90.bias_and_rotate``): x + b (b read in its own
        dtype, widened to fp32), then ``_turn`` by row * t[p, 0] + column * t[p, 1] turns."""
        if cutlass.const_expr(self.has_bias or self.rotate):
            rotated = n0 < self.rot_cols  # wholly-v tiles: bias only
            last_pair = mTurns.shape[0] - 1  # a last tile's columns past 3*H*D are not stored
            if cutlass.const_expr(self.rotate):
                row = cutlass.min(m0 + coord[0][0], mCoords.shape[0] - 1)
                pos_r = Float32(mCoords[row, 0])
                pos_c = Float32(mCoords[row, 1])
            for i in cutlass.range_constexpr(cute.size(r_acc) // 2):
                p = cutlass.min((n0 + coord[2 * i][1]) // 2, last_pair)
                x0 = r_acc[2 * i]
                x1 = r_acc[2 * i + 1]
                if cutlass.const_expr(self.has_bias):
                    x0 = x0 + mBias[2 * p].to(Float32)
                    x1 = x1 + mBias[2 * p + 1].to(Float32)
                if cutlass.const_expr(self.rotate):
                    if rotated:
                        x0, x1 = _turn(x0, x1, pos_r * mTurns[p, 0] + pos_c * mTurns[p, 1])
                r_acc[2 * i] = x0
                r_acc[2 * i + 1] = x1
