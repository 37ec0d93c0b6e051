"""examples/slurm/multinode.sbatch, parsed: the torchrun command it starts on every node
meets through a rendezvous built from SLURM's variables, is accepted by this torch's
torchrun, passes the time limit's signal on to the ranks, and runs a train.py command
whose configuration resumes, names the run alike on every node and catches that signal.
(tests/integration/test_preemption_multinode.py runs it on a real SLURM.)"""

from __future__ import annotations

import re
import shlex

from torch.distributed.run import get_args_parser

from tests.unit.test_cluster_examples import EXAMPLES, checkpoint_config
from tests.unit.test_docs import check_train_py

SCRIPT = EXAMPLES / "slurm" / "multinode.sbatch"
SLURM_VARS = {"SLURM_NNODES": "4", "SLURM_JOB_ID": "7", "head": "node1", "port": "29507"}


def sbatch_options(text: str) -> dict[str, str]:
    return dict(
        (m.group(1), m.group(2) or "")
        for m in re.finditer(r"^#SBATCH --([\w-]+)(?:=(\S+))?$", text, re.M)
    )


def torchrun_command(text: str) -> list[str]:
    """The ``srun ... python -m torch.distributed.run ...`` line, SLURM's variables filled in."""
    joined = text.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if ln.startswith("srun ")]
    for name, value in SLURM_VARS.items():
        line = line.replace(f'"${name}"', value).replace(f"${name}", value)
    line = line.replace('"${NPROC_PER_NODE:-1}"', "1").replace('"${PYTHON:-python}"', "python")
    return shlex.split(line)


def test_every_node_runs_one_agent_that_meets_the_others_at_the_first_node():
    text = SCRIPT.read_text()
    options = sbatch_options(text)
    assert "requeue" in options and options["ntasks-per-node"] == "1"
    assert re.search(
        r'^head=\$\(scontrol show hostnames "\$SLURM_JOB_NODELIST" \| head -n 1\)$', text, re.M
    )
    assert re.search(r"^port=\$\{RDZV_PORT:-\$\(\(29500 \+ SLURM_JOB_ID % 1000\)\)\}$", text, re.M)
    argv = torchrun_command(text)
    srun, python = argv[: argv.index("-m")], argv[argv.index("-m") :]
    assert srun == ["srun", "--ntasks-per-node=1", "python"]
    assert python[:2] == ["-m", "torch.distributed.run"]
    args = get_args_parser().parse_args(python[2:])  # this torch's torchrun accepts it
    assert (args.nnodes, args.nproc_per_node) == ("4", "1")
    assert (args.rdzv_backend, args.rdzv_endpoint) == ("c10d", "node1:29507")
    assert args.rdzv_id == "7"  # the job id: the same across requeues
    assert args.max_restarts >= 1
    assert args.training_script == "train.py"


def test_the_train_command_resumes_names_the_run_alike_and_its_agents_pass_its_signals_on():
    text = SCRIPT.read_text()
    python = torchrun_command(text)
    args = get_args_parser().parse_args(python[python.index("-m") + 2 :])
    overrides = [a for a in args.training_script_args if a != "$@"]
    check_train_py("multinode.sbatch", overrides)
    assert "+resume=latest" in overrides
    # no run.name: train.py names the run slurm-<job id>, the same on every node and restart
    assert not any(o.startswith("run.name=") for o in overrides)
    ck = checkpoint_config(overrides)
    name, lead = sbatch_options(text)["signal"].split("@")  # USR1@120: to every process
    signal = f"SIG{name}"
    assert int(lead) >= 60  # SLURM's 30 s tick, then a step and a checkpoint
    assert ck.cluster.time_limit_signal == signal and ck.cluster.requeue == "time_limit"
    assert signal in ck.preempt_signals
    handled = args.signals_to_handle.split(",")
    assert set(ck.preempt_signals) <= set(handled)  # else an agent dies of one, or drops it
    assert {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"} <= set(handled)  # torchrun's own four
    # what the comments promise a preempted rank exits with
    assert re.findall(r"exit (\d+) \(", text) == [str(ck.preempt_exit_code)]
