"""The batch folder's stores as a reader in another process sees them: requests read back
from the log, answers found at once after a miss, in any order, and after the folder is
removed and made again."""

from __future__ import annotations

import random
import shutil

from hypernodes_dist.batchapi.identity import Canonical, canonical_body, request_digest
from hypernodes_dist.batchapi.recording import Answer
from hypernodes_dist.batchapi.store import AnswerStore, RequestLog

ENDPOINT = "/v1/chat/completions"


def _body(i: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": f"row {i} \u00e9"}]}


def test_a_logged_request_reads_back_as_the_canonical_body_it_was(tmp_path):
    log = RequestLog(tmp_path)
    log.record(ENDPOINT, _body(1), "llm")
    (req,) = list(RequestLog(tmp_path).requests())
    made = Canonical(_body(1), canonical_body(_body(1)))
    assert type(req.body) is Canonical and req.body == made
    assert {s: getattr(req.body, s) for s in Canonical.__slots__} == \
        {s: getattr(made, s) for s in Canonical.__slots__}
    assert (req.endpoint, req.digest, req.source) == \
        (ENDPOINT, request_digest(ENDPOINT, _body(1)), "llm")


def test_a_log_of_older_and_escaped_lines_reads_back_alike(tmp_path):
    """A log line in the layout before the model and inputs were written beside the body
    (a rerun of a map an older version began), or whose header JSON escapes a character,
    reads back as the same request, parsed; the lines in the layout around it as well."""
    body = _body(2)
    canonical = canonical_body(body)
    digest = request_digest(ENDPOINT, body)
    log = RequestLog(tmp_path)
    log.record(ENDPOINT, _body(1), "llm")
    with open(next((tmp_path / "requests").glob("*.jsonl")), "ab") as f:
        f.write(b'{"d":"' + digest.encode() + b'","e":"' + ENDPOINT.encode()
                + b'","s":"llm","b":' + canonical + b"}\n")
    log.record(ENDPOINT, {**_body(3), "model": "m\u00e9"}, "ll\"m")
    reqs = list(RequestLog(tmp_path).requests())
    assert [(r.endpoint, r.digest, r.source, r.model, r.inputs) for r in reqs] == [
        (ENDPOINT, request_digest(ENDPOINT, _body(1)), "llm", "m", 1),
        (ENDPOINT, digest, "llm", "m", 1),
        (ENDPOINT, request_digest(ENDPOINT, {**_body(3), "model": "m\u00e9"}), 'll"m',
         "m\u00e9", 1)]
    assert reqs[1].body == body and reqs[1].canonical == canonical


def test_an_answer_written_after_a_miss_is_found_at_once_in_any_order(tmp_path):
    writer, reader = AnswerStore(tmp_path), AnswerStore(tmp_path)
    writer.make()
    digests = [f"{i:032x}" for i in range(3000)]
    assert reader.get(digests[0]) is None  # a miss, then the answers arrive
    writer.put("batch-1", [(d, Answer(200, {"n": i, "pad": "x" * (i % 300)}))
                           for i, d in enumerate(digests)])
    order = list(enumerate(digests))
    assert reader.raw(digests[0]) is not None
    for i, d in order + random.Random(7).sample(order, len(order)):  # file order, then any
        assert reader.get(d) == Answer(200, {"n": i, "pad": "x" * (i % 300)})


def test_a_folder_removed_and_made_again_is_read_anew(tmp_path):
    writer, reader = AnswerStore(tmp_path), AnswerStore(tmp_path)
    writer.make()
    writer.put("b1", [("a" * 32, Answer(200, {"v": 1}))])
    assert reader.get("a" * 32) == Answer(200, {"v": 1})
    shutil.rmtree(tmp_path / "answers")
    AnswerStore(tmp_path).make()
    AnswerStore(tmp_path).put("b2", [("b" * 32, Answer(200, {"v": 2}))])
    assert reader.get("b" * 32) == Answer(200, {"v": 2})
    assert reader.get("a" * 32) is None


def test_a_round_reads_the_settled_folder_once_and_the_next_round_sees_new_answers(tmp_path):
    """The driver writes answers between two rounds of the rows: within a round, once a miss
    found the folder settled, later misses do not read it; the next round reads it anew,
    and outside rounds every miss reads it (as the driver's own reads do)."""
    writer, reader = AnswerStore(tmp_path), AnswerStore(tmp_path)
    writer.make()  # dated a minute back: settled
    a, b = "a" * 32, "b" * 32
    with reader.round():
        assert reader.raw(a) is None  # read: settled, nothing in it
        writer.put("late", [(a, Answer(200, {"v": 1}))])  # another process, mid-round
        assert reader.raw(a) is None and reader.get(a) is None  # not read again this round
    with reader.round():  # the next round reads it at its first miss
        assert reader.get(a) == Answer(200, {"v": 1})
    assert reader.get(b) is None  # outside a round: every miss reads the folder
    writer.put("next", [(b, Answer(200, {"v": 2}))])
    assert reader.get(b) == Answer(200, {"v": 2})


def test_requests_recorded_in_a_round_are_all_in_the_log_when_it_ends(tmp_path):
    """In a round the log holds its lines (one write for many) up to ``_HELD_BYTES``; every
    request recorded in it is in the log once the round ends, before the driver reads it;
    outside a round a request is in the log at once."""
    log = RequestLog(tmp_path)
    digests = [request_digest(ENDPOINT, _body(i)) for i in range(4000)]
    with log.round():
        for i in range(4000):
            log.record(ENDPOINT, _body(i), "llm")
        seen = [r.digest for r in RequestLog(tmp_path).requests()]
        assert 0 < len(seen) < 4000 and seen == digests[:len(seen)]  # past _HELD_BYTES
    assert [r.digest for r in RequestLog(tmp_path).requests()] == digests
    log.record(ENDPOINT, _body(4000), "llm")
    assert len(list(RequestLog(tmp_path).requests())) == 4001


def test_a_request_digest_is_blake2b_of_its_endpoint_and_canonical_body():
    """The digest (the custom_id's second half) is BLAKE2b-128 over the endpoint, a newline
    and the canonical body, whichever endpoint came first in this process."""
    import hashlib

    from hypernodes_dist.batchapi.identity import digest_of

    for endpoint in ("/v1/embeddings", ENDPOINT, "/v1/embeddings", "/v1/messages"):
        for i in range(3):
            canonical = canonical_body(_body(i))
            assert digest_of(endpoint, canonical) == hashlib.blake2b(
                endpoint.encode() + b"\n" + canonical, digest_size=16).hexdigest()
