"""The delivery-policy settings (not in Go nsqd; docs/policies.md): the flags, the config-file keys,
their refusals, and the pure rules of broker.policy (which policy applies, the dead-letter pattern)."""

import json
import pytest

from nsqd_threaded.broker.policy import NO_POLICY, NOTHING, Policy, effective_policy, is_dead_letter_topic
from nsqd_threaded.settings.options import expand_dead_letter_topic

from support.cli import invoke, options_for


def test_defaults_are_off():
    opts, warnings = options_for()
    assert (opts.max_attempts, opts.dead_letter_topic, opts.msg_ttl) == (0, "", 0.0) and not warnings


def test_flags():
    opts, _ = options_for("--max-attempts=5", "--dead-letter-topic={topic}-dlq", "-msg-ttl", "1h30m")
    assert (opts.max_attempts, opts.dead_letter_topic, opts.msg_ttl) == (5, "{topic}-dlq", 5400.0)


def test_config_file_keys_and_flag_precedence(tmp_path):
    path = tmp_path / "nsqd.cfg"
    path.write_text('max_attempts = 3\ndead_letter_topic = "graveyard"\nmsg_ttl = 90000  # milliseconds\n')
    opts, warnings = options_for("--config=%s" % path, "--max-attempts=4")
    assert (opts.max_attempts, opts.dead_letter_topic, opts.msg_ttl) == (4, "graveyard", 90.0) and not warnings
    path.write_text('msg_ttl = "2m"\n')
    assert options_for("--config=%s" % path)[0].msg_ttl == 120.0


@pytest.mark.parametrize("args, reason", [
    (["--max-attempts=-1"], "--max-attempts must be [0,65535] (got -1)"),
    (["--max-attempts=65536"], "--max-attempts must be [0,65535] (got 65536)"),
    (["--msg-ttl=-1s"], "--msg-ttl must be 0 (none) or at least 1ms (got -1s)"),
    (["--msg-ttl=10us"], "--msg-ttl must be 0 (none) or at least 1ms (got 10µs)"),
    (["--dead-letter-topic=bad name"], "--dead-letter-topic=bad name: invalid topic name or pattern"),
    (["--dead-letter-topic={topic}#ephemeral.x"], "--dead-letter-topic={topic}#ephemeral.x: invalid topic name"),
    (["--dead-letter-topic=" + "x" * 65], "invalid topic name or pattern"),
])
def test_bad_values_are_fatal(args, reason):
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert "FATAL: failed to instantiate nsqd - " in result.output and reason in result.output


def test_the_pattern():
    assert expand_dead_letter_topic("{topic}-dlq", "orders") == "orders-dlq"
    assert expand_dead_letter_topic("dlq", "orders") == "dlq"
    assert expand_dead_letter_topic("{topic}_{topic}", "a") == "a_a"
    assert is_dead_letter_topic("{topic}-dlq", "orders-dlq")
    assert is_dead_letter_topic("dlq-{topic}", "dlq-orders")
    assert is_dead_letter_topic("{topic}_{topic}", "ab_ab")
    assert not is_dead_letter_topic("{topic}_{topic}", "ab_cd")
    assert not is_dead_letter_topic("{topic}-dlq", "orders")
    assert not is_dead_letter_topic("{topic}-dlq", "-dlq")  # (no topic has an empty name)
    assert is_dead_letter_topic("graveyard", "graveyard") and not is_dead_letter_topic("graveyard", "orders")
    assert not is_dead_letter_topic("", "orders")


def test_which_policy_applies():
    defaults = Policy(3, "{topic}-dlq", 60 * 10**9)
    assert effective_policy(NO_POLICY, NOTHING, "t") == NOTHING
    assert effective_policy(NO_POLICY, defaults, "orders") == Policy(3, "orders-dlq", 60 * 10**9)
    own = Policy(9, None, None)
    assert effective_policy(own, defaults, "orders") == Policy(9, "orders-dlq", 60 * 10**9)
    assert effective_policy(Policy(None, "elsewhere", 10**9), defaults, "orders") == Policy(3, "elsewhere", 10**9)
    # A channel's own "nothing" wins over a default as any own value does: unlimited, drop, no TTL.
    assert effective_policy(Policy(0, None, None), defaults, "orders") == Policy(0, "orders-dlq", 60 * 10**9)
    assert effective_policy(Policy(None, "", None), defaults, "orders") == Policy(3, "", 60 * 10**9)
    assert effective_policy(Policy(None, None, 0), defaults, "orders") == Policy(3, "orders-dlq", 0)
    assert effective_policy(NOTHING, defaults, "orders") == NOTHING
    # A dead-letter topic is left to its own policy.
    assert effective_policy(NO_POLICY, defaults, "orders-dlq") == NOTHING
    assert effective_policy(own, defaults, "orders-dlq") == Policy(9, "", 0)
    # A name too long to be a topic's: dropped (no dead-letter topic), the limits still apply.
    assert effective_policy(NO_POLICY, defaults, "x" * 62) == Policy(3, "", 60 * 10**9)


def test_policy_json():
    policy = Policy(3, "t-dlq", 1500 * 10**6)
    assert policy.as_json() == {"max_attempts": 3, "dead_letter_topic": "t-dlq", "msg_ttl": 1500}
    assert Policy.from_json(policy.stored_json()) == policy
    assert Policy.from_json({}) == NO_POLICY
    # Inherited fields are null; the channel's own "nothing" is 0 and "", kept as such.
    for own in (NO_POLICY, NOTHING, Policy(0, None, None), Policy(None, "", 0), Policy(None, None, 10**6)):
        assert Policy.from_json(json.loads(json.dumps(own.stored_json()))) == own
    assert NOTHING.stored_json() == {"max_attempts": 0, "dead_letter_topic": "", "msg_ttl": 0, "format": 2}
    assert NO_POLICY.as_json() == {"max_attempts": None, "dead_letter_topic": None, "msg_ttl": None}
    # A policy stored before own settings could be "nothing" (no "format"): its 0 and "" were inherited.
    assert Policy.from_json({"max_attempts": 9, "dead_letter_topic": "", "msg_ttl": 0}) == Policy(9, None, None)
    for bad in ({"max_attempts": -1}, {"max_attempts": True}, {"max_attempts": 70000}, {"msg_ttl": "1s"},
                {"msg_ttl": -5}, {"dead_letter_topic": "bad name"}, {"dead_letter_topic": 7}, {"format": 3},
                {"format": True}, {"format": "2"}):
        with pytest.raises(ValueError):
            Policy.from_json(bad)
