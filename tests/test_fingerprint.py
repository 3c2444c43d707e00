"""A failed rank's fingerprint from what a plain Python process leaves (`supervisor.fingerprint`)."""

from __future__ import annotations

import json

from trainguard.supervisor.fingerprint import fingerprint

TRACEBACK = """[W1128 15:21:28.168385857 Utils.hpp:137] Warning: something deprecated
[rank1]: Traceback (most recent call last):
[rank1]:   File "/w/train.py", line 36, in <module>
[rank1]:     main()
[rank1]:   File "/w/train.py", line 27, in main
[rank1]:     opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
[rank1]:                                                  ~~~~~~^^^^^^
[rank1]: KeyError: 'lr'
<frozen abc>:119: FutureWarning: `torch.distributed.reduce_op` is deprecated
"""


def test_the_last_traceback_gives_type_message_and_innermost_file_line():
    assert fingerprint(1, None, TRACEBACK) == "KeyError: 'lr' @ train.py:27"


def test_torchelastic_error_file_comes_first():
    record = {
        "message": {
            "message": "ValueError: no shard at 0x7f3a2b",
            "extraInfo": {
                "py_callstack": 'Traceback...\n  File "/w/data.py", line 9, in load\n',
                "timestamp": "1",
            },
        }
    }
    assert fingerprint(1, json.dumps(record), TRACEBACK) == "ValueError: no shard at <hex> @ data.py:9"


def test_a_syntax_error_names_its_file_and_line():
    text = '  File "/w/train.py", line 3\n    def main(:\n             ^\nSyntaxError: invalid syntax\n'
    assert fingerprint(1, None, text) == "SyntaxError: invalid syntax @ train.py:3"


def test_an_exception_of_any_name_is_read():
    text = (
        'Traceback (most recent call last):\n  File "/w/t.py", line 5, in <module>\n    go()\nBadConfig: lr\n'
    )
    assert fingerprint(1, None, text) == "BadConfig: lr @ t.py:5"


def test_no_traceback_takes_the_last_error_line_with_the_exit_code():
    text = "python: can't open file '/w/nope.py': [Errno 2] No such file or directory\n"
    assert fingerprint(2, None, text) == "exit 2: " + text.strip()


def test_pids_addresses_and_ports_are_masked_but_other_numbers_are_kept():
    a = fingerprint(1, None, "RuntimeError: worker pid 4242 at 0xdeadbeef lost 127.0.0.1:29500, shard 3\n")
    b = fingerprint(1, None, "RuntimeError: worker pid 77 at 0xfeed lost 127.0.0.1:41000, shard 3\n")
    c = fingerprint(1, None, "RuntimeError: worker pid 77 at 0xfeed lost 127.0.0.1:41000, shard 4\n")
    assert a == b != c


def test_a_signal_a_clean_exit_or_no_error_text_has_no_fingerprint():
    assert fingerprint(-9, None, TRACEBACK) is None
    assert fingerprint(0, None, TRACEBACK) is None
    assert fingerprint(1, None, "epoch 3 | loss 0.2\n") is None


def test_the_module_example_runs():
    import doctest

    from trainguard.supervisor import fingerprint as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_a_peers_loss_seen_from_the_survivor_has_no_fingerprint():
    gloo = (
        'Traceback (most recent call last):\n  File "/w/multinode.py", line 52, in _run_batch\n'
        "    loss.backward()\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:29500\n"
    )
    assert fingerprint(1, None, gloo) is None
    assert fingerprint(1, None, "torch.distributed.DistNetworkError: failed to recv, got 0 bytes\n") is None
