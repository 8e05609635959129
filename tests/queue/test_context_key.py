"""The unique key in the stored context record (spec/queue.md Q-53).

Goal: a key is stored where a restart can read it back, in every codec, and a record
without one keeps its exact bytes. Method: encode and decode real records with the
JSON, tagged and pickle codecs; rewrite attempts as a retry and an operator retry do.
"""

from __future__ import annotations

import datetime
import json
import uuid

import pytest

from deferq import ContextCodec, ContextError, JsonTypes
from deferq._runtime.serialize import Context, decode_context, encode_context, reset_attempts


@pytest.mark.spec("Q-53")
def test_a_key_is_the_last_field_and_a_record_without_one_is_unchanged() -> None:
    plain = Context("mail.Send", ("a@example.com", 1), {"x": None}, 0)
    assert encode_context(plain) == (
        b'{"v":1,"task":"mail.Send","args":["a@example.com",1],"kwargs":{"x":null},"attempts":0}')
    keyed = plain._replace(key="welcome-\u00e9")
    data = encode_context(keyed)
    assert data == ('{"v":1,"task":"mail.Send","args":["a@example.com",1],"kwargs":{"x":null},'
                    '"attempts":0,"key":"welcome-\u00e9"}').encode()
    assert decode_context(data) == keyed
    retried = decode_context(encode_context(keyed.with_attempts(3)))
    assert (retried.attempts, retried.key) == (3, "welcome-\u00e9")
    # The operators' retry rewrites attempts only (Q-33).
    reset = reset_attempts(encode_context(keyed.with_attempts(3)))
    assert reset == data


@pytest.mark.spec("Q-53", "Q-191")
def test_the_key_survives_the_tagged_and_the_pickle_codecs() -> None:
    tagged = ContextCodec(json_types=JsonTypes())
    value = Context("t", (uuid.UUID(int=5), datetime.date(2026, 1, 2)), {}, 2, "k-1")
    data = tagged.encode(value)
    assert json.loads(data)["v"] == 2 and list(json.loads(data))[-1] == "key"
    assert tagged.decode(data) == value
    sealed = ContextCodec(pickle_key=b"k" * 16, use_pickle=True)
    for key in ("k-2", None):
        record = Context("t", ({1, 2},), {}, 1, key)
        assert sealed.decode(sealed.encode(record)) == record


@pytest.mark.spec("Q-53", "Q-192")
@pytest.mark.parametrize("key", [1, "", None, ["k"]])
def test_a_key_that_is_not_a_non_empty_string_is_refused(key: object) -> None:
    record = {"v": 1, "task": "t", "args": [], "kwargs": {}, "attempts": 0, "key": key}
    data = json.dumps(record).encode()
    with pytest.raises(ContextError, match="context field 'key'"):
        decode_context(data)
