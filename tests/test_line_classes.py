"""The failure classes of TF/XLA, Open MPI, Horovod, Slurm, Ray, gloo and storage lines (#36, #37,
#38, #41): each line's category, whether it is a consequence, whom it blames, and the root cause
it leads to. Lines are shaped as the programs print them (Open MPI's help texts, Horovod's stall
inspector, the TF/XLA coordination service, gloo's TCP pair, c10d's TCPStore)."""

from __future__ import annotations

import pytest

from trainguard.detect.training_log import classify_training_line, line_node, line_rank
from trainguard.incidents.advice import AttemptOutcome, recommend, root_line
from trainguard.incidents.correlate import JobFinding, explain_job, root_cause_for
from trainguard.incidents.nodes import NodeLine, node_failure
from trainguard.incidents.taxonomy import RootCause, as_evidence
from trainguard.records import Category, Event

GLOO_CLOSED = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:28048"
MPIRUN_KILLED = (
    "mpirun noticed that process rank 3 with PID 4242 on node gpu-b07 exited on signal 9 (Killed)."
)
HEARTBEAT = ("2024-10-09 15:47:38.568412: E external/xla/xla/tsl/distributed_runtime/coordination/coordination_service.cc:1170] "
             "/job:jax_worker/replica:0/task:5 has been set to ERROR in coordination service: UNAVAILABLE: Task "
             "/job:jax_worker/replica:0/task:5 heartbeat timeout. This indicates that the remote task has failed, got "
             "preempted, or crashed unexpectedly. [type.googleapis.com/tensorflow.CoordinationServiceError='']")  # fmt: skip
HOROVOD_SHUTDOWN = ("AbortedError (see above for traceback): Horovod has been shut down. This was caused by an exception "
                    "on one of the ranks or an attempt to allreduce, allgather or broadcast a tensor after one of the "
                    "ranks finished execution.")  # fmt: skip
ILLEGAL = "[rank2]: RuntimeError: CUDA error: an illegal memory access was encountered"


def _event(line: str, t: float | None = None) -> Event:
    event = classify_training_line(line, now=t)
    assert event is not None, line
    return event


@pytest.mark.parametrize(
    ("line", "category", "sympathetic"),
    [
        # gloo, NCCL, TCPStore, Open MPI and PMIx report a peer that went away: consequences
        (GLOO_CLOSED, "nccl_network", True),
        ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [192.168.7.2]:25266: "
         "Connection reset by peer", "nccl_network", True),
        ("[rank1]:[W618 10:26:54.029068449 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=105, "
         "addr=[localhost]:39468, remote=[node-a]:29500): Connection reset by peer", "nccl_network", True),
        ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
         "nccl_network", True),
        ("[node3][[51384,1],7][btl_tcp.c:559:mca_btl_tcp_recv_blocking] recv(25) failed: Connection reset by peer (104)",
         "nccl_network", True),
        ("An MPI communication peer process has unexpectedly disconnected.  This", "nccl_network", True),
        ("[cn007:24154] PMIX ERROR: UNREACHABLE in file server/pmix_server.c at line 2147", "nccl_network", True),
        # connections never made are the network's (a firewall, a wrong interface), not consequences
        ("[node1][[3041,1],0][btl_tcp_endpoint.c:796:mca_btl_tcp_endpoint_complete_connect] connect() to 10.0.0.7 "
         "failed: No route to host (113)", "nccl_network", False),
        ("A process or daemon was unable to complete a TCP connection", "nccl_network", False),
        # a node lost: Open MPI/PRRTE, Slurm, Ray, the TF/XLA coordination service
        ("ORTE has lost communication with a remote daemon.", "node_host", False),
        ("PRTE has lost communication with a remote daemon.", "node_host", False),
        ("salloc: error: Node failure on worker-1", "node_host", False),
        ("slurmstepd: error: *** JOB 4242 ON gpu-b07 CANCELLED AT 2024-05-22T10:14:02 DUE TO NODE FAILURE ***",
         "node_host", False),
        ("The node with node id: 75b2 and ip: 10.4.4.107 has been marked dead because the detector has missed too "
         "many heartbeats from it.", "node_host", False),
        (HEARTBEAT, "node_host", True),  # the service reports a task it lost
        # the launcher's word on a rank killed by a signal: judged by the signal
        (MPIRUN_KILLED, "node_host", False),
        ("prterun noticed that process rank 0 with PID 77 on node n1 exited on signal 11 (Segmentation fault).",
         "application_bug", False),
        ("MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD", "application_bug", False),
        # Horovod: the stall inspector is a hang; a shutdown after another rank's error is a consequence
        ("[1,0]<stderr>:[2019-10-09 15:36:43.594972: W horovod/common/stall_inspector.cc:105] One or more tensors "
         "were submitted to be reduced, gathered or broadcasted by subset of ranks", "nccl_timeout_hang", False),
        (HOROVOD_SHUTDOWN, "unknown", True),
        ("[1]<stderr>:horovod.common.exceptions.HorovodInternalError", "unknown", True),
        # TF/XLA: OOM, collective timeouts, stream-executor event errors judged by the CUDA error they name
        ("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
         "shape[64,512,512] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
         "cuda_oom", False),
        ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
         "6291456 bytes.", "cuda_oom", False),
        ("tensorflow.python.framework.errors_impl.DeadlineExceededError: Collective has timed out during execution.",
         "nccl_timeout_hang", False),
        ("E tensorflow/stream_executor/cuda/cuda_event.cc:29] Error polling for event status: failed to query "
         "event: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure", "gpu_hardware", False),
        ("E tensorflow/stream_executor/cuda/cuda_event.cc:29] Error polling for event status: failed to query "
         "event: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "cuda_oom", False),
        ("E tensorflow/stream_executor/cuda/cuda_driver.cc:466] failed call to cuInit: CUDA_ERROR_NO_DEVICE",
         "driver_software", False),
        # storage: a full or failing disk while writing a checkpoint
        ("OSError: [Errno 28] No space left on device", "node_host", False),
        ("OSError: [Errno 5] Input/output error: '/ckpt/step_400/model.pt'", "node_host", False),
    ],
)  # fmt: skip
def test_the_new_classes_get_their_category_and_consequences_are_marked(line, category, sympathetic):
    event = _event(line)
    assert (event.category.value, event.sympathetic) == (category, sympathetic)


@pytest.mark.parametrize(
    "line",
    [
        "This is usually due to either a failure of the TCP network",
        "   NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.",
        "Primary job  terminated normally, but 1 process returned",
        "2020-09-24 21:35:23.363348: W tensorflow/core/common_runtime/bfc_allocator.cc:246] Allocator (GPU_0_bfc) "
        "ran out of memory trying to allocate 1.02GiB with freed_by_count=0. The caller indicates that this is not a "
        "failure, but may mean that there could be performance gains if more memory were available.",
        "[0]<stdout>:Iter #1: 114.1 img/sec per GPU",
    ],
)
def test_help_text_progress_and_tf_allocator_hints_are_not_findings(line):
    assert classify_training_line(line) is None


def test_mpirun_noticing_a_killed_rank_names_that_rank_and_its_node():
    assert (line_rank(MPIRUN_KILLED), line_node(MPIRUN_KILLED)) == (3, "gpu-b07")
    assert line_rank("[1,0]<stderr>:MPI_ABORT was invoked on rank 5 in communicator MPI_COMM_WORLD") == 5
    assert line_rank("application called MPI_Abort(MPI_COMM_WORLD, 0) - process 7") == 7
    assert (
        line_rank("srun: error: c002: task 6: Killed"),
        line_node("srun: error: c002: task 6: Killed"),
    ) == (6, "c002")


def test_a_line_without_a_named_culprit_speaks_for_the_rank_that_printed_it():
    assert line_rank("[1,3]<stderr>:Traceback (most recent call last):") == 3
    assert line_rank("Thu Aug 29 16:41:02 2019[4]<stderr>:  what():  " + GLOO_CLOSED) == 4
    # Horovod's coordinator (rank 0) prints the rank it waits on; several missing ranks name none
    assert line_rank("[1,0]<stderr>:HorovodBroadcast_dense_0 [missing ranks: 1]") == 1
    assert line_rank("[1,0]<stderr>:HorovodAllreduce_acc_0 [missing ranks: 0, 1, 3, 4]") == 0


def test_a_coordination_service_heartbeat_timeout_is_a_lost_task_and_names_it():
    # printed by the service about task 5: a consequence naming the lost task, whose cause the line
    # cannot tell (its host, its process, the network; the task was alive but slow in its thread)
    event = _event(HEARTBEAT)
    assert event.category is Category.NODE_HOST and line_rank(HEARTBEAT) == 5
    evidence = as_evidence(event)
    assert evidence is not None and evidence.symptom and evidence.rank == 5
    assert evidence.cause is RootCause.UNKNOWN and RootCause.HOST in dict(evidence.suspects)


def test_gloo_connection_closed_is_a_consequence_never_the_network_or_a_bug():
    evidence = as_evidence(_event(GLOO_CLOSED))
    assert evidence is not None and evidence.symptom and evidence.cause is RootCause.UNKNOWN
    assert RootCause.HOST in dict(evidence.suspects)
    # alone, the survivors' lines leave the cause unknown (the peer's node among the suspects)
    assert root_cause_for([_event(GLOO_CLOSED, 10.0), _event(GLOO_CLOSED, 11.0)]) is RootCause.UNKNOWN
    ex = explain_job([JobFinding(_event(GLOO_CLOSED, 10.0), 0), JobFinding(_event(GLOO_CLOSED, 11.0), 1)])
    assert ex.cause is RootCause.UNKNOWN and ex.confidence == "low"
    assert any("suspects: host (the peer's node" in line for line in ex.evidence)
    # the dead peer's own error, even a later one, is the cause
    dead = JobFinding(_event("ValueError: bad batch", 12.0), 2)
    assert explain_job([JobFinding(_event(GLOO_CLOSED, 10.0), 0), dead]).root == dead


def test_a_node_the_launcher_reports_lost_is_the_failed_node():
    lines = [
        NodeLine(0, "a", 10.0, GLOO_CLOSED.replace("10.0.0.2", "10.0.0.9")),  # an address no host has
        NodeLine(None, None, None, "ORTE has lost communication with a remote daemon."),
        NodeLine(None, None, None, "  Remote daemon: [[64112,0],1] on node b"),
    ]
    verdict = node_failure(lines, {0: "a", 1: "b"}, {})
    assert verdict is not None and (verdict.host, verdict.ranks, verdict.category) == (
        "b",
        (1,),
        "node_failure",
    )


def test_a_full_disk_is_storage_and_a_full_dev_shm_the_hosts_memory():
    disk = as_evidence(_event("OSError: [Errno 28] No space left on device"))
    shm = as_evidence(_event("RuntimeError: unable to write to file </torch_18_29> : No space left on device (28) "
                             "failed to extend /dev/shm"))  # fmt: skip
    assert disk is not None and disk.cause is RootCause.DEPENDENCY
    assert shm is not None and shm.cause is RootCause.HOST


def test_an_illegal_address_is_the_first_failure_even_before_the_others_timeouts():
    timeouts = [JobFinding(_event(f"[rank{r}]: [Rank {r}] Watchdog caught collective operation timeout", 600.0 + r), r)
                for r in (0, 1, 3)]  # fmt: skip
    ex = explain_job([*timeouts, JobFinding(_event(ILLEGAL, 10.0), 2)])
    assert ex.root is not None and ex.root.rank == 2 and ex.cause is RootCause.UNKNOWN
    assert ex.confidence == "medium"
    assert any("suspects: software_bug (the driver" in line and "faulty_gpu" in line for line in ex.evidence)


def test_a_driver_error_beside_an_illegal_address_makes_it_the_drivers():
    driver = JobFinding(_event("[rank2]: RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA "
                               "runtime version", 30.0), 2)  # fmt: skip
    ex = explain_job([JobFinding(_event(ILLEGAL, 10.0), 2), driver])
    assert ex.root is not None and ex.root.event.text == ILLEGAL and ex.cause is RootCause.SOFTWARE_BUG
    assert any("the driver's or a CUDA library's fault" in line for line in ex.evidence)


def test_horovod_shutting_down_is_never_the_root_line_and_only_a_symptom():
    assert (
        root_line([HOROVOD_SHUTDOWN, "ValueError: bad batch at step 40"])
        == "ValueError: bad batch at step 40"
    )
    assert root_line([HOROVOD_SHUTDOWN, GLOO_CLOSED]) is None
    evidence = as_evidence(_event(HOROVOD_SHUTDOWN))
    assert evidence is not None and evidence.symptom and evidence.cause is RootCause.UNKNOWN


def test_a_lost_node_restarts_without_it_and_a_full_disk_stops_for_a_person():
    lost = recommend(
        [AttemptOutcome(1, "ORTE has lost communication with a remote daemon.", step=40, node="b")]
    )
    assert (lost.verb, lost.exit_code) == ("restart_without", 76) and "node b" in lost.reason
    full = recommend([AttemptOutcome(1, "OSError: [Errno 28] No space left on device", step=400)])
    assert (full.verb, full.exit_code, full.signature) == ("stop", 1, "storage_full")
    # a failing disk's I/O error restarts: shared file systems recover
    failing = recommend(
        [AttemptOutcome(1, "OSError: [Errno 5] Input/output error: '/ckpt/step_400'", step=400)]
    )
    assert failing.verb == "restart"


@pytest.mark.parametrize("module", ["trainguard.detect.culprit", "trainguard.detect.training_log"])
def test_the_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_every_needle_makes_its_line_a_candidate_and_a_cut_needle_does_not():
    from trainguard.detect import prefilter

    engines = [prefilter.hits_stdlib]
    if prefilter.scan_engine() == "hyperscan":
        engines.append(prefilter.hits_hyperscan)
    anchors = [a for a in prefilter.anchors() if a.decode() not in prefilter.NEEDLE_CONTEXT]
    for anchor in anchors:
        line, cut = b"x " + anchor + b" y\n", b"x " + anchor[:-1] + b"\n"
        for hits in engines:
            assert hits(line, len(line))[0], (hits.__name__, anchor)
            if not any(a in cut for a in prefilter.anchors()):
                assert hits(cut, len(cut))[0] == [], (hits.__name__, anchor)
