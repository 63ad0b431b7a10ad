"""JobSpec validation: every problem reported at once, each saying what to change."""

import pytest

from cookbook.spec import (
    EPHEMERAL_PORTS_START,
    SHARED_PORT_SPAN,
    JobSpec,
    SpecError,
    check_spec,
    parse_overrides,
    time_seconds,
)


def test_default_spec_is_valid():
    assert check_spec(JobSpec("llama3_3_70b_full")) == []


def test_all_problems_listed_together():
    problems = check_spec(
        JobSpec(
            "x", nodes=0, time="abc", profile="local-cpu", gpus_per_node=8, env={"HF_TOKEN": "hf_x"}, job_name="a\nb"
        )
    )
    text = "\n".join(problems)
    for expected in ("nodes=0", "time='abc'", "gpus_per_node=0", "secrets are never written", "newline"):
        assert expected in text


def test_gpu_profile_needs_gpus_and_efa_needs_exclusive():
    assert any("gpus_per_node >= 1" in p for p in check_spec(JobSpec("x", gpus_per_node=0)))
    assert any("exclusive" in p for p in check_spec(JobSpec("x", profile="aws-efa", exclusive=False)))


@pytest.mark.parametrize(
    ("spare_nodes", "message"),
    [
        (-1, "spare_nodes=-1: cannot be negative; use 0 for no spares"),
        (3, "spare_nodes=3 is more than nodes=2: at most one spare per training node; set --spare-nodes 2 or fewer"),
        (1.5, "spare_nodes=1.5: give a whole number, e.g. spare_nodes=1"),
        ("1", "spare_nodes='1': give a whole number, e.g. spare_nodes=1"),
    ],
)
def test_spare_nodes_are_a_whole_number_at_most_the_training_nodes_one_line_each(spare_nodes, message):
    assert check_spec(JobSpec("llama3_3_70b_full", nodes=2, spare_nodes=spare_nodes)) == [message]


def test_spare_nodes_up_to_the_training_nodes_are_valid():
    assert check_spec(JobSpec("llama3_3_70b_full", nodes=2, spare_nodes=2)) == []
    assert JobSpec("llama3_3_70b_full").spare_nodes == 0


def test_signal_must_come_before_time_limit():
    assert any("signal_seconds" in p for p in check_spec(JobSpec("x", time="1", signal_seconds=120)))


def test_parse_overrides_and_time():
    assert parse_overrides(["a.b=1", "c=x=y"]) == {"a.b": "1", "c": "x=y"}
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_overrides(["novalue"])
    assert time_seconds("1-02:03:04") == 93784 and time_seconds("90") == 5400 and time_seconds("01:00:00") == 3600


def test_profile_defaults_fill_only_what_the_user_did_not_give():
    from cookbook.spec import make_spec

    local = make_spec("llama3_3_70b_lora", "local-cpu", time=None)
    assert local.gpus_per_node == 0 and not local.exclusive and local.time == "00:10:00"
    assert 20000 <= local.port, "jobs sharing a local node need their own rendezvous port"
    # every port a job may get (port + job id % span) is below the kernel's ephemeral ports
    assert local.port + SHARED_PORT_SPAN - 1 < EPHEMERAL_PORTS_START
    gpu = make_spec("llama3_3_70b_lora", "nebius", nodes=4, time="01:00:00")
    assert (gpu.gpus_per_node, gpu.exclusive, gpu.nodes, gpu.time, gpu.port) == (8, True, 4, "01:00:00", 29500)
