"""Elastic Horovod (TensorFlow) with trainguard's host discovery: a host the fleet drains leaves the job.

    printf '#!/bin/sh\nexec trainguard hosts -q --format horovod --hostfile hosts\n' > discover.sh
    chmod +x discover.sh
    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./discover.sh \
        python examples/mpi/horovod_elastic.py

Each step all-reduces a tensor and commits the state every 5 steps; when a discovery call stops
listing a host (its node drained, cordoned or failed in the fleet store), Horovod removes its
workers and the others go on from the last commit, with fewer ranks. Released Horovod (0.28.1)
does not build against current TensorFlow or torch (docs/mpi.md); this was run with a Horovod
built with its XLA ops left out, on TensorFlow 2.21.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd
import tensorflow as tf

STEPS = 80


def main() -> None:
    hvd.init()
    w = tf.Variable(0.0)
    state = hvd.elastic.TensorFlowState(variables=[w], step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TensorFlowState) -> None:
        while state.step < STEPS:
            hvd.allreduce(tf.constant(1.0), op=hvd.Sum)
            w.assign_add(1.0)
            state.step += 1
            if state.step % 5 == 0:
                host = os.environ.get("TRAINGUARD_HOST", os.uname().nodename)
                print(f"step {state.step} size {hvd.size()} rank {hvd.rank()} host {host}", flush=True)
                state.commit()
            time.sleep(0.3)

    train(state)


if __name__ == "__main__":
    main()
