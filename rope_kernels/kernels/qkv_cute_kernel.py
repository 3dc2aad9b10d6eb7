"""The CuTe DSL kernel of ``qkv_cute.py`` (Hopper, sm_90a): Kimi's QKV projection with its
2D RoPE in the epilogue. This module imports CuTe DSL (``nvidia-cutlass-dsl``) at the top:
only ``qkv_cute.compile_kernel`` imports it, when a kernel is first compiled. The design
(producer warp, two consumer warp groups in ping-pong, W multicast over the cluster, the
rotation on the accumulator in registers) is described in ``qkv_cute``'s docstring.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

from rope_kernels.kernels.qkv_cute_config import EPI_STAGES, TILE_K, TILE_M, CuteQKVConfig


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
    """The sm_90a kernel: ``KimiQKVRopeSm90(cfg, rot_cols, has_bias, elem_bytes)`` is
    compiled by ``cute.compile(kernel, x, w, out, turns, bias, coords,
    max_active_clusters, stream)`` (``qkv_cute.compile_kernel``). ``rot_cols``: the q|k
    columns (2*H*D), rotated; the v columns past them get the bias only. ``bias`` is the
    layer's own (3*H*D,) vector, read in its dtype at every launch (not read where
    ``has_bias`` is False)."""

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
                 mTurns: cute.Tensor, mBias: cute.Tensor, mCoords: cute.Tensor,
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
                                               2 * EPI_STAGES)
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
        self.kernel(tma_x, gX, tma_w, gW, tma_out, gOut, mTurns, mBias, mCoords, tiled_mma,
                    a_layout, b_layout, epi_layout, sched).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster_shape, 1),
            min_blocks_per_mp=1, stream=stream)

    @cute.kernel
    def kernel(self, tma_x: cute.CopyAtom, gX: cute.Tensor, tma_w: cute.CopyAtom,
               gW: cute.Tensor, tma_out: cute.CopyAtom, gOut: cute.Tensor,
               mTurns: cute.Tensor, mBias: cute.Tensor, mCoords: cute.Tensor,
               tiled_mma: cute.TiledMma,
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
                         sOut, tma_out, tOut, mTurns, mBias, mCoords, k_tiles, sched_params)

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
    def consume(self, me, t, ring, turns, tiled_mma, sX, sW, sOut, tma_out, tOut, mTurns,
                mBias, mCoords, k_tiles, sched_params):
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
            num_stages=EPI_STAGES,
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
            self.bias_and_rotate(acc, coord, m0, n0, mTurns, mBias, mCoords)

            out_tile = cute.zipped_divide(tOut[(None, None, m_t, n_t)], self.epi_tile)
            s_part, g_part = cute.nvgpu.cpasync.tma_partition(
                tma_out, 0, cute.make_layout(1), cute.group_modes(sOut, 0, 2), out_tile)
            n_subs = cute.size(out_tile, mode=[1])
            sub_grid = cute.make_layout(out_tile.shape[1], stride=(out_tile.shape[1][1], 1))
            for e in cutlass.range_constexpr(n_subs):
                for v in cutlass.range_constexpr(sub_size):
                    sub_f32[v] = r2s_acc[e * sub_size + v]
                sub_out.store(sub_f32.load().to(sOut.element_type))
                buf = me * EPI_STAGES + (subtiles + e) % EPI_STAGES
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
    def bias_and_rotate(self, acc, coord, m0, n0, mTurns, mBias, mCoords):
        """Bias, then Kimi's rotation, on the fp32 accumulator in place. WGMMA's C
        fragment is ((2 columns, 2 rows, tile_n/8 column groups), m64 blocks, 1): a
        pair's two columns sit in one thread's two adjacent registers. Each thread
        reads the positions of its 4 rows once, and the turns and the two bias values
        of each of its column pairs once (the bias in its own dtype, widened to fp32)."""
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
                    b0 = mBias[2 * p].to(Float32)
                    b1 = mBias[2 * p + 1].to(Float32)
                if cutlass.const_expr(self.rotate):
                    fr = mTurns[p, 0]
                    fc = mTurns[p, 1]
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
