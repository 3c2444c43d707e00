"""What can be done, one typed vocabulary per scope (stdlib-only).

Every loop of trainguard decides for its own scope, and each scope has its own action type::

    Advice       a finding's advice (detect/): what should be done, weakest first
    StepAction   the trainer, at one step (torch/, keras/): apply, skip, roll back
    JobAction    the supervisor, for the job on this node (supervisor/policy.py)
    GroupAction  the replica loop, for one replica group or all of them (supervisor/replicas/)
    NodeAction   the node agent, for the node or one of its GPUs (remediate/)
    PersonAction what a person did through the CLI or the agent's admin API

The values are what incidents record in ``Incident.action`` and what JSON and SQLite carry, so
no value means two things: `scope_of` tells which loop took an incident's action. Advice and the
agent's node actions share the names of the acts a finding advises (``reset_gpu``,
``reboot_node``, ``drain``): an incident with one of those records the act, so they read as the
node's.

    >>> scope_of("exclude_gpu"), scope_of("replace_group"), scope_of("drain"), scope_of("restart_app")
    (<Scope.JOB: 'job'>, <Scope.GROUP: 'group'>, <Scope.NODE: 'node'>, <Scope.ADVICE: 'advice'>)
    >>> scope_of("none") is None and scope_of("no such action") is None
    True
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "Advice",
    "GroupAction",
    "JobAction",
    "NodeAction",
    "PersonAction",
    "Scope",
    "StepAction",
    "scope_of",
]


class Scope(str, Enum):
    ADVICE = "advice"
    STEP = "step"
    JOB = "job"
    GROUP = "group"
    NODE = "node"
    PERSON = "person"


class Advice(str, Enum):
    """What should be done about a finding, from weakest to strongest."""

    NONE = "none"
    IGNORE = "ignore"
    RESTART_APP = "restart_app"
    RUN_DIAGNOSTICS = "run_diagnostics"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    DRAIN = "drain"
    CONTACT_SUPPORT = "contact_support"

    @property
    def rank(self) -> int:
        return _ADVICE_ORDER.index(self)


_ADVICE_ORDER = list(Advice)


class StepAction(str, Enum):
    """The trainer's decision about one step's update."""

    PROCEED = "proceed"  # apply the update
    SKIP = "skip"  # drop the update of this step and go on
    ROLLBACK = "rollback"  # the state was restored; continue from the resume step


class JobAction(str, Enum):
    """The supervisor's decision about the job's workers on this node."""

    RESTART = "restart"
    EXCLUDE_GPU = "exclude_gpu"
    DIAGNOSE = "diagnose"
    CONTINUE = "continue"
    REBALANCE = "rebalance"  # the ranks moved their shares of the batch by measured speed
    RESTORE_SHARES = "restore_shares"  # ... and back to uniform shares once the speeds are even
    STOP_CRASH_LOOP = "stop_crash_loop"
    STOP_BUDGET = "stop_budget"
    STOP_NO_CAPACITY = "stop_no_capacity"
    SKIP_TORN_CHECKPOINT = "skip_torn_checkpoint"  # the resume went on from an older checkpoint

    @property
    def stops(self) -> bool:
        return self in (JobAction.STOP_CRASH_LOOP, JobAction.STOP_BUDGET, JobAction.STOP_NO_CAPACITY)

    @property
    def loses_gpu(self) -> bool:
        """The decision takes its GPU out of service (excluded, or failed with none left)."""
        return self in (JobAction.EXCLUDE_GPU, JobAction.STOP_NO_CAPACITY)

    @property
    def keeps_running(self) -> bool:
        """The workers go on as they are: the decision is recorded, nothing is done to them."""
        return self in (JobAction.CONTINUE, JobAction.REBALANCE, JobAction.RESTORE_SHARES)

    @classmethod
    def of(cls, action: str | None) -> JobAction | None:
        """The job action an incident's ``action`` records; None for another scope's."""
        try:
            return cls(action)
        except ValueError:
            return None


class GroupAction(str, Enum):
    """The replica loop's decision about one replica group (or all of them)."""

    RESTART_LIGHTHOUSE = "restart_lighthouse"
    FINISHED = "finished"  # the group's training completed
    REPLACE = "replace_group"  # start the group again (on a spare GPU when its own was excluded)
    STOP_GROUP = "stop_group"  # crash loop / budget: this group stays down
    RESTART_ALL = "restart_all_groups"  # every group down: a normal restart from the durable checkpoint
    STOP_JOB = "stop_job"


class NodeAction(str, Enum):
    """What the node agent can do about a finding, weakest first."""

    NONE = "none"
    WEBHOOK = "webhook"  # tell someone (JSON POST, HMAC-signed)
    DRAIN = "drain"  # Slurm: no new jobs on the node
    CORDON = "cordon"  # Kubernetes: unschedulable + taint
    RESET_GPU = "reset_gpu"  # nvidia-smi -r on an idle GPU
    REBOOT_NODE = "reboot_node"  # scheduler-driven reboot (Slurm: scontrol reboot ASAP)
    HARDWARE_INSPECTION = "hardware_inspection"  # out of service until a person says otherwise

    @property
    def takes_node_out(self) -> bool:
        """Whether this action removes the node (or a GPU of it) from service: breakers count these."""
        return self not in (NodeAction.NONE, NodeAction.WEBHOOK)


class PersonAction(str, Enum):
    """What a person did (recorded, never decided by trainguard)."""

    BREAKER_RESET = "breaker_reset"  # closed a remediation breaker
    RESUME = "resume"  # returned a node to service after a passing diagnostic
    SET_HEALTHY = "set_healthy"  # took a node or GPU out of hardware inspection


# Later scopes win a shared value: an incident records the act, not the advice behind it.
_SCOPES: dict[str, Scope] = {}
for _scope, _kind in (
    (Scope.ADVICE, Advice),
    (Scope.STEP, StepAction),
    (Scope.JOB, JobAction),
    (Scope.GROUP, GroupAction),
    (Scope.NODE, NodeAction),
    (Scope.PERSON, PersonAction),
):
    _SCOPES.update({a.value: _scope for a in _kind})
_SCOPES.pop("none")


def scope_of(action: str | None) -> Scope | None:
    """Which loop an incident's ``action`` belongs to; None for ``none`` or an unknown value."""
    return _SCOPES.get(action or "")
