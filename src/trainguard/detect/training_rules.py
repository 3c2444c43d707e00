"""The signature table of the training-log classifier (``training_log``): one row per failure shape.

Rows are tried in order, most specific first, on lines holding one of the row's needles: "CUDA
error: uncorrectable ECC error" is an ECC fault before it is a CUDA error, a host's OOM killer
before a GPU's OOM. A row marked ``sympathetic`` reports a consequence of another process's or
node's failure (a peer that closed its connection, Horovod shutting down after another rank's
exception): the line keeps its category, and the root cause comes from elsewhere. The needles are
also what the scanner's first pass searches for in bulk, so they are specific ("NCCL WARN", not
"NCCL": with NCCL_DEBUG=INFO a third of all lines say "NCCL").

Where each shape comes from: PyTorch (c10d, gloo, NCCL, torch elastic), TensorFlow/Keras and XLA
(BFC allocator, stream executor, coordination service, collective executor), Open MPI and PRRTE
(help texts of mpirun, the daemons, the TCP transport, PMIx), Horovod (stall inspector), Slurm
(srun, slurmstepd, the cgroup killer), Ray (GCS health checks), the kernel and libc.
"""

from __future__ import annotations

from typing import NamedTuple

from trainguard.actions import Advice
from trainguard.records import Category, Severity

__all__ = ["AMBIGUOUS_CUDA", "RULES", "Rule"]

C, S, A = Category, Severity, Advice


class Rule(NamedTuple):
    needles: tuple[str, ...]  # the pattern is tried only on lines holding one of these
    pattern: str
    category: Category
    severity: Severity
    action: Advice
    sympathetic: bool = False  # the line reports a consequence, never a cause


# CUDA failures whose cause one line cannot tell: the threads behind them found a driver or library
# (cuBLAS, cuDNN) mismatch as often as a program's bad index or a failing GPU. Such a line is
# "unknown" with those suspects (``incidents.taxonomy``) until other evidence decides: an Xid or
# ECC error on the same GPU makes it the GPU's, a driver error beside it the driver's.
AMBIGUOUS_CUDA = (
    r"CUBLAS_STATUS_EXECUTION_FAILED|CUDNN_STATUS_EXECUTION_FAILED|illegal memory access"
    r"|CUDA_ERROR_ILLEGAL_ADDRESS|cudaErrorIllegalAddress"
)

RULES: tuple[Rule, ...] = (
    # GPU memory and GPU faults
    Rule(("ECC error", "ECC_UNCORRECTABLE", "ECCUncorrectable"), r"uncorrectable ECC error|ECC errors? (?:detected|encountered)"
         r"|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable", C.GPU_MEMORY_ECC, S.FATAL, A.RESET_GPU),
    Rule(("no CUDA-capable device", "GPU is lost", "cudaErrorDevicesUnavailable", "fallen off the bus"),
         r"no CUDA-capable device is detected|GPU is lost|cudaErrorDevicesUnavailable|GPU has fallen off the bus",
         C.GPU_HARDWARE, S.FATAL, A.REBOOT_NODE),
    Rule(("Unable to determine the device handle",), r"Unable to determine the device handle for GPU ?[0-9A-Fa-f:.]+: ",
         C.GPU_HARDWARE, S.ERROR, A.RESET_GPU),  # nvidia-smi: "Unknown Error" and kin
    Rule(("NVLink error",), r"uncorrectable NVLink error", C.GPU_HARDWARE, S.ERROR, A.RESET_GPU),
    # host memory before the GPU's: "DefaultCPUAllocator: can't allocate memory" is the node's RAM
    Rule(("DefaultCPUAllocator", "DataLoader worker", "Out of memory", "out of memory: Kill", "oom-kill", "oom_reaper",
          "Killed process", "oom_kill", "Out Of Memory", "OOM Killed", "out-of-memory handler", "bad_alloc",
          "MemoryError", "Cannot allocate memory", "exited unexpectedly", "shared memory segment", "/dev/shm", "OOMKilled"),
         r"DefaultCPUAllocator: (?:can't allocate|not enough) memory|DataLoader worker \(pid \d+\) is killed by signal: "
         r"(?:Killed|Bus error)|[Oo]ut of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:|oom_reaper"
         r"|Killed process \d+ \("
         # the batch system's cgroup killer (Slurm's step daemon and srun), the container runtime's
         r"|Detected \d+ oom[-_]kill event|tasks? [\d,-]+: Out Of Memory|OOM Killed|cgroup out-of-memory handler|OOMKilled"
         # the process's own allocator: C++, Python, libc (errno 12)
         r"|std::bad_alloc|(?:^|[\]:]\s|\s)MemoryError\b|\[Errno 12\] Cannot allocate memory|Error code 12 \(Cannot allocate"
         # shared memory (/dev/shm) full: DataLoader workers and NCCL's shm transport
         r"|DataLoader worker \(pids?\(?s?\)? [\d, ]+\) exited unexpectedly|Error while creating shared memory segment"
         r"|failed to extend /dev/shm|/dev/shm\S* .*No space left on device",
         C.NODE_HOST, S.ERROR, A.RESTART_APP),
    # a peer node gone: torch elastic's rendezvous, Open MPI/PRRTE's daemons, Slurm, Ray's GCS, the
    # TF/XLA coordination service (JAX's too) name the node or task they lost
    Rule(("keep-alive heartbeat", "RendezvousConnectionError", "RendezvousClosedError", "Detected dead node",
          "C10d store has failed", "failed to shutdown the rendezvous", "ORTE has lost", "PRTE has lost", "Remote daemon",
          "The node with", "Exiting because this node manager", "Node failure on", "NODE FAILURE",
          ),
         r"failed to send a keep-alive heartbeat to the rendezvous|RendezvousConnectionError|RendezvousClosedError"
         r"|Detected dead node|connection to the C10d store has failed|has failed to shutdown the rendezvous"
         r"|(?:ORTE|PRTE|PRRTE) has lost communication with (?:a remote daemon|its daemon)|Remote daemon\s*: \S+ on node \S"
         r"|has been marked dead because the (?:detector|monitor) has missed too many heartbeats"
         r"|mistakenly been marked (?:as )?dead|error: Node failure on \S|DUE TO NODE FAILURE",
         C.NODE_HOST, S.ERROR, A.RESTART_APP),
    # the TF/XLA coordination service (TensorFlow's multi-worker jobs, JAX's) on a task it lost: a task
    # that stopped sending heartbeats, one set to ERROR, a cluster that never formed. A survivor prints
    # these about the lost task (``culprit.line_rank`` reads which): a consequence of that task's loss
    Rule(("stopped sending heartbeats", "This indicates that the remote task", "in coordination service",
          "cluster registration failed"),
         r"tasks are unhealthy \(stopped sending heartbeats\)|\S+ heartbeat timeout\. This indicates that the remote task"
         r"|has been set to ERROR in coordination service|Stopping coordination service as cluster registration failed",
         C.NODE_HOST, S.ERROR, A.RESTART_APP, sympathetic=True),
    # storage: a full or failing disk or file system (checkpoint writes, data reads)
    Rule(("No space left on device", "Input/output error", "Disk quota exceeded", "Read-only file system",
          "Stale file handle"),
         r"No space left on device|Input/output error|Disk quota exceeded|Read-only file system|Stale file handle",
         C.NODE_HOST, S.ERROR, A.RESTART_APP),
    # OOM before generic CUDA errors: "CUDA error: out of memory" is the job's size, not the GPU
    Rule(("out of memory", "OutOfMemoryError", "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC", "CUDNN_STATUS_ALLOC",
          "Tried to allocate", "OOM when", "RESOURCE_EXHAUSTED", "Resource exhausted", "CUDA_ERROR_OUT_OF_MEMORY",
          "Failed to CUDA"),
         r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
         r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|Tried to allocate [\d.]+ [KMG]iB \(GPU \d"
         # TensorFlow/Keras's BFC allocator, XLA (JAX, TF, torch-xla), the CUDA driver API's name for it
         r"|OOM when allocating tensor|RESOURCE_EXHAUSTED: (?:OOM|Out of memory|Failed to allocate)"
         r"|Resource exhausted: (?:OOM|Out of memory)|CUDA_ERROR_OUT_OF_MEMORY"
         # NCCL's own allocations (buffers, proxies): the GPU was full when the communicator needed memory
         r"|Cuda failure (?:2 )?'out of memory'|Failed to CUDA (?:calloc|malloc|host alloc)",
         C.CUDA_OOM, S.ERROR, A.RESTART_APP),
    Rule(("EXECUTION_FAILED", "illegal memory access", "ILLEGAL_ADDRESS", "IllegalAddress"), AMBIGUOUS_CUDA,
         C.UNKNOWN, S.ERROR, A.RESTART_APP),
    Rule(("device-side assert", "Assertion `", "CUDA error: ", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED"),
         r"device-side assert triggered|Assertion `.*` failed"
         r"|CUDA error: (?:misaligned address|an illegal instruction|no kernel image|invalid device function)"
         r"|CUDA_ERROR_ILLEGAL_INSTRUCTION|CUDA_ERROR_MISALIGNED_ADDRESS",
         C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    Rule(("launch failure", "CUDNN_STATUS_MAPPING", "ncclUnhandledCudaError", "unhandled cuda error",
          "CUDA error: unknown error", "Cuda failure 999", "CUDA_ERROR_LAUNCH_FAILED"),
         r"launch failure|CUDNN_STATUS_MAPPING_ERROR|ncclUnhandledCudaError|unhandled cuda error"
         r"|CUDA error: unknown error|Cuda failure 999|CUDA_ERROR_LAUNCH_FAILED",
         C.GPU_HARDWARE, S.ERROR, A.RESTART_APP),
    Rule(("CUDA driver", "CUDA error: ", "CUBLAS_STATUS_", "CUDNN_STATUS_", "NVIDIA driver", "NVRM: No NVIDIA",
          "nvidia-container-cli", "No devices were found", "Cuda failure", "cuda runtime error", "not yet initialized",
          "CUDA_ERROR_", "Status: cudaGetErrorString", "Unable to load NCCL library"),
         r"CUDA driver version is insufficient|CUDA driver initialization failed|system not yet initialized"
         r"|CUDA error: forward compatibility|CUDA error: initialization error|NVIDIA driver on your system is too old"
         r"|NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver|NVRM: No NVIDIA \w+ \w+ probed"
         r"|nvidia-container-cli: initialization error|No devices were found\s*$|NCCL WARN Cuda failure"
         r"|CUBLAS_STATUS_(?:INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH)"
         r"|CUDNN_STATUS_(?:INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH|VERSION_MISMATCH|RUNTIME_\w+)"
         # TF/XLA's stream executor: no driver to talk to, a CUDA runtime of another version, no NCCL
         r"|failed call to cuInit: CUDA_ERROR_\w+|cudaGetErrorString symbol not found|Unable to load NCCL library",
         C.DRIVER_SOFTWARE, S.ERROR, A.DRAIN),
    Rule(("CUBLAS_STATUS_", "CUDNN_STATUS_", "CUDA error:"), r"CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|CUDA error:",
         C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    # hangs first (they mention NCCL too), then the network, then the rest
    Rule(("collective operation timeout", "NCCL operations", "Heartbeat monitor", "watchdog got stuck", "ncclTimeout",
          "NCCL timeout", "detected by watchdog", "Timeout at NCCL work", "heartbeat of its watchdog",
          "in call to wait()", "NCCL communicator was aborted", "thread terminated with exception", "stop signal",
          "dump signal", "attempting to dump debug info", "blocking wait"),
         r"collective operation timeout|Some NCCL operations have failed or timed out|Heartbeat monitor timed out"
         r"|watchdog got stuck|ncclTimeout|NCCL timeout|Exception \(either an error or timeout\) detected by watchdog"
         r"|failure detected by watchdog|Timeout at NCCL work|detected no heartbeat of its watchdog"
         r"|timed out in call to wait\(\)|NCCL communicator was aborted|watchdog thread terminated with exception"
         # torch 2.3+: the watchdog's dump-and-abort wordings, blocking-wait timeouts
         r"|Received a (?:dump|global stop) signal|flight recorder dump signal from another rank"
         r"|Terminating the process after attempting to dump debug info|timed out in blocking wait",
         C.NCCL_TIMEOUT_HANG, S.ERROR, A.RESTART_APP),
    # Horovod's stall inspector (ranks that never submitted the tensor the others wait on), gloo's
    # read timeout, TensorFlow's collective executor aborting a collective that ran out of time
    Rule(("One or more tensors were submitted", "missing ranks:", "ready ranks:", "One or more rank",
          "Read timeout [", "Collective has timed out", "StartAbort", "Barrier timed out"),
         r"One or more tensors were submitted to be reduced|\[(?:missing|ready) ranks: \d|is stalled for longer than \d"
         r"|Read timeout \[[^\]]*\]:\d|Collective has timed out|StartAbort (?:DEADLINE_EXCEEDED|Deadline Exceeded)"
         # the coordination service's barrier: a task never arrived (crashed, slow, never scheduled)
         r"|Barrier timed out\. (?:Barrier_id|Id):",
         C.NCCL_TIMEOUT_HANG, S.ERROR, A.RESTART_APP),
    # a peer that went away, as its survivors' transports report it (gloo, NCCL, c10d's TCPStore,
    # tensorpipe, Open MPI's TCP transport and PMIx): a consequence of the peer's loss
    # (not "Connection closed by": NCCL INFO lines say "Connection closed by localRank 0" thousands
    # of times a job, and they would all reach Python)
    Rule(("Connection closed by peer", "Connection closed by remote peer", "Connection reset by peer", "Broken pipe",
          "ncclRemoteError", "NCCL error", "An MPI communication peer", "PMIX ERROR: UNREACHABLE", "Read error ["),
         r"Connection closed by (?:remote )?peer|Connection reset by peer|failed : Broken pipe|ncclRemoteError"
         r"|remote process exited or there was a network error|peer process has unexpectedly disconnected"
         r"|PMIX ERROR: UNREACHABLE|Read error \[[^\]]*\]:\d",
         C.NCCL_NETWORK, S.ERROR, A.RESTART_APP, sympathetic=True),
    # TensorFlow's gRPC runtime when a peer worker is gone: its collective aborts, naming the peer
    # task it could not reach (the UnavailableError that carries it is a restatement: below)
    Rule(("Collective ops is aborted by",),
         r"Collective ops is aborted by: .*(?:failed to connect|Connection (?:refused|reset)|Socket closed)",
         C.NCCL_NETWORK, S.ERROR, A.RESTART_APP, sympathetic=True),
    Rule(("Got completion", "Got async event", "ncclSystemError", "unhandled system error", "network error", "NCCL WARN",
          "A process or daemon was unable", "The client socket has failed", "TCP client failed",
          "Gloo connectFullMesh failed", "NET/OFI", "mca_btl_tcp"),
         r"NET/IBP?\s*:\s*Got (?:completion|async event)|ncclSystemError|unhandled system error"
         r"|NCCL WARN.*(?:[Cc]onnect|[Ss]ocket|NET/|IB|timed out|[Bb]roken pipe|[Pp]roxy|ibv_)"
         # connections that could not be made: a firewall, a wrong interface, an unreachable host
         r"|unable to complete a TCP connection|client socket has failed to connect|failed to connect/validate to host"
         r"|connectFullMesh failed|NET/OFI .*completed with error|mca_btl_tcp_\w+\] .*failed",
         C.NCCL_NETWORK, S.ERROR, A.RESTART_APP),
    # the adapter itself: a port that lost its cable or link takes the node off the fabric
    Rule(("Cable unplugged", "Link down", "Port module event"), r"mlx5_core.*(?:Cable unplugged|Link down|Port module event.*[Ee]rror)",
         C.NCCL_NETWORK, S.ERROR, A.DRAIN),
    Rule(("ncclInternalError", "internal error - please report", "internal error, NCCL version"),
         r"ncclInternalError|internal error - please report|internal error, NCCL version",
         C.DRIVER_SOFTWARE, S.ERROR, A.RESTART_APP),
    Rule(("ncclInvalid", "invalid usage"), r"ncclInvalidUsage|ncclInvalidArgument|invalid usage",
         C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    Rule(("NCCL WARN", "NCCL error", "NCCL Error"), r"NCCL WARN|NCCL [Ee]rror", C.NCCL_NETWORK, S.WARNING, A.RESTART_APP),
    # the launcher's word on a rank that died of a signal (mpirun, prterun): judged by the signal
    Rule(("exited on signal",), r"noticed that (?:process|job) rank \d+ .*exited on signal (?:9|7)\b",
         C.NODE_HOST, S.ERROR, A.RESTART_APP),
    Rule(("exited on signal",), r"noticed that (?:process|job) rank \d+ .*exited on signal (?:11|6|4|8)\b",
         C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    Rule(("exited on signal",), r"noticed that (?:process|job) rank \d+ .*exited on signal \d+",
         C.UNKNOWN, S.ERROR, A.RESTART_APP),
    # the program gave up (its own error is printed before), or another rank's failure stopped it
    Rule(("MPI_ABORT was invoked", "MPI_Abort("), r"MPI_ABORT was invoked on rank \d+|called MPI_Abort\(",
         C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    Rule(("Horovod has been shut down", "HorovodInternalError"), r"Horovod has been shut down|HorovodInternalError",
         C.UNKNOWN, S.ERROR, A.RESTART_APP, sympathetic=True),
    # TensorFlow's UNAVAILABLE: a peer or the coordination service could not be reached; why is
    # printed before it (the coordination service's lines above), the exception only restates it
    Rule(("UnavailableError",), r"(?:^|[\]:.]\s?)UnavailableError(?::\s|\s*$)", C.UNKNOWN, S.ERROR, A.RESTART_APP,
         sympathetic=True),
    # the host
    Rule(("Killed", "SIGKILL", "exitcode"), r"^\W*Killed\s*$|\d+\s+Killed\s+\S|\bSIGKILL\b|exitcode\s*:\s*-9\b"
         r"|tasks? [\d,-]+: Killed\b",  # srun: a task killed (the cgroup's OOM killer, a signal)
         C.NODE_HOST, S.ERROR, A.RESTART_APP),
    Rule(("Bus error", "bus error", "SIGBUS", "exitcode"), r"\b[Bb]us error\b|\bSIGBUS\b|exitcode\s*:\s*-7\b",
         C.NODE_HOST, S.ERROR, A.RESTART_APP),  # often /dev/shm full
    # crashes and torchelastic's summary
    Rule(("Segmentation fault", "SIGSEGV", "Fatal Python", "segfault", "SIGABRT", "exitcode"),
         r"Segmentation fault|\bSIGSEGV\b|Fatal Python error|\bsegfault at\b|\bSIGABRT\b|exitcode\s*:\s*-(?:11|6)\b",
         C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    Rule(("ChildFailedError", "exitcode"), r"ChildFailedError|exitcode\s*:\s*-?[1-9]\d*\b", C.APPLICATION_BUG, S.ERROR,
         A.RESTART_APP),
    # the last line of a Python traceback, e.g. "ValueError: ..." (possibly behind a "[rank3]:" tag)
    Rule(("Error", "Exception"), r"(?:^|[\]:]\s)\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::\s|\s*$)",
         C.APPLICATION_BUG, S.WARNING, A.RESTART_APP),
)  # fmt: skip
