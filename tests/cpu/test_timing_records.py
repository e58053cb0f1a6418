from types import SimpleNamespace as NS

from moebench.timing.records import (ActivityKinds, ExternalRec, KernelRec, RecordBatch, group_by_external_id,
                                     parse_activities, tag_kernels)

KINDS = ActivityKinds(kernel=frozenset({10}), external_correlation=20, api=frozenset({1, 2}))


def stream():
    """A recorded-like stream: flush kernel (untagged), then a 2-kernel sample (ext 7), in
    CUPTI's delivery order (API records first, kernels later, external records interleaved)."""
    return [
        NS(kind=2, cbid=211, correlation_id=1),                      # runtime launch of the flush
        NS(kind=1, cbid=307, correlation_id=2),                      # driver launch, sample kernel 1
        NS(kind=20, correlation_id=2, external_id=7, external_kind=1),
        NS(kind=1, cbid=307, correlation_id=3),
        NS(kind=20, correlation_id=3, external_id=7, external_kind=1),
        NS(kind=10, name="gemm2", start=300, end=400, correlation_id=3, stream_id=7),
        NS(kind=10, name="reduce_kernel", start=0, end=100, correlation_id=1, stream_id=7),
        NS(kind=10, name="gemm1", start=150, end=290, correlation_id=2, stream_id=7),
        NS(kind=99),                                                  # something else
    ]


def test_parse_counts_and_converts():
    batch = RecordBatch()
    parse_activities(stream(), KINDS, batch)
    assert len(batch.kernels) == 3 and batch.kernels[0] == KernelRec("gemm2", 300, 400, 3, 7)
    assert batch.externals == [ExternalRec(2, 7), ExternalRec(3, 7)]
    assert batch.api_records == 3 and batch.other_records == 1


def test_correlation_ties_kernels_to_external_ids_in_start_order():
    batch = RecordBatch()
    parse_activities(stream(), KINDS, batch)
    tagged = tag_kernels(batch)
    assert [(t.name, t.external_id) for t in tagged] == [("reduce_kernel", 0), ("gemm1", 7), ("gemm2", 7)]
    groups = group_by_external_id(tagged)
    assert list(groups) == [7] and [k.name for k in groups[7]] == ["gemm1", "gemm2"]


def test_conflicting_external_ids_are_marked_not_guessed():
    batch = RecordBatch(kernels=[KernelRec("k", 0, 10, 5)], externals=[ExternalRec(5, 1), ExternalRec(5, 2)])
    assert tag_kernels(batch)[0].external_id == -1


def test_extend_merges_batches():
    a = RecordBatch(kernels=[KernelRec("k", 0, 1, 1)], dropped=1, api_records=2)
    a.extend(RecordBatch(kernels=[KernelRec("j", 2, 3, 2)], dropped=2, events_ns={1: 5}))
    assert len(a.kernels) == 2 and a.dropped == 3 and a.api_records == 2 and a.events_ns == {1: 5}


def test_launch_cbid_filter_picks_launch_calls():
    from moebench.timing.cupti_tracer import launch_cbids
    members = {"cuLaunchKernel": 307, "cuLaunchKernelEx": 652, "cuMemcpyAsync": 41, "cuCtxSynchronize": 17,
               "_runtime_api_trace_cbid__cudaLaunchKernel_v13000": 211, "cudaMalloc_v3020": 20}
    assert launch_cbids(members) == {307, 652, 211}
