"""One llama-server process on 127.0.0.1 and what it answers, validated.

A generation is streamed with `timings_per_token`, so every token arrives with the server's running
draft counters (draft_n, draft_n_accepted). Tokens that share the same counters belong to one verify
round, so the stream itself gives each round's drafted and accepted counts, and the number of tokens
each round emitted must equal its accepted drafts plus one: an independent count of the counters.
The rounds' sums must also equal the final timings and the deltas of the server's /metrics counters
(per draft position too), or the generation is refused.

One gap: llama-server streams a token only once its text ends in a whole UTF-8 character, and never
streams the ids of the tokens it held back (a character split over byte tokens: an emoji, a CJK
sign). The chunks' running `tokens_predicted` shows the gap. Such a generation's ids are then read
from the same request answered whole (`return_tokens`, deterministic for a fixed seed; the ids both
show must agree), and its rounds from the server's budget rule, pinned by the stream's counters
where they show them and by the /metrics deltas of the streamed request (`rounds_with_gaps`).
Per-position counts do not depend on the rounds' order, so the record's figures stay exact; only
the order is lost.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atlas import AtlasError
from atlas.decode.generate import RoundCounts, RunStats
from atlas.omp import engine_env

START_TIMEOUT = 300.0
MAX_STATES = 100_000  # a bound on the walk over hidden rounds (rounds_with_gaps); real gaps hold a handful


class Timings(BaseModel):
    model_config = ConfigDict(extra="ignore")

    predicted_n: int = Field(ge=0)
    predicted_ms: float = Field(ge=0)
    prompt_n: int = Field(ge=0)
    draft_n: int = Field(default=0, ge=0)
    draft_n_accepted: int = Field(default=0, ge=0)


class Chunk(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[int]
    stop: bool
    tokens_predicted: int = Field(ge=0)
    timings: Timings | None = None


@dataclass
class Counters:
    """The server's speculative counters (/metrics), summed over its lifetime."""

    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def minus(self, before: Counters) -> Counters:
        width = max(len(self.accepted_per_position), len(before.accepted_per_position))
        pad = lambda xs: xs + [0] * (width - len(xs))  # noqa: E731
        return Counters(self.drafted - before.drafted, self.accepted - before.accepted, self.rounds - before.rounds,
                        [a - b for a, b in zip(pad(self.accepted_per_position), pad(before.accepted_per_position))])


@dataclass
class Completion:
    tokens: list[int]
    rounds: list[tuple[int, int]]  # (drafted, accepted) per verify pass of the decode phase; (0, 0) a plain step
    seconds: float  # the server's own decode time (after the first token), timings.predicted_ms
    timings: Timings


def rounds_from_stream(chunks: list[Chunk]) -> tuple[list[int], list[tuple[int, int]]]:
    """(tokens, rounds) from the streamed chunks: the first token comes from the prefill; after it,
    tokens with unchanged counters after a round's tokens are plain steps, (0, 0). A round must
    have emitted at least its accepted drafts plus one token, or the counters and the tokens disagree."""
    tokens: list[int] = []
    rounds: list[tuple[int, int]] = []
    last = (0, 0)
    pending = 0  # tokens the current round still owes (its accepted drafts + 1)
    for chunk in chunks:
        if not chunk.tokens:
            continue
        if len(chunk.tokens) != 1 or chunk.timings is None:
            raise AtlasError("llama-server streamed a chunk without exactly one token and its timings (timings_per_token)")
        now = (chunk.timings.draft_n, chunk.timings.draft_n_accepted)
        if now != last:
            drafted, accepted = now[0] - last[0], now[1] - last[1]
            if pending:
                raise AtlasError(f"llama-server's counters moved after {rounds[-1][1] + 1 - pending} of the "
                                 f"{rounds[-1][1] + 1} tokens its last round accepted")
            if not 0 <= accepted <= drafted or drafted == 0 or not tokens:
                raise AtlasError(f"llama-server's draft counters went from {last} to {now}: not a verify round")
            rounds.append((drafted, accepted))
            pending = accepted + 1
            last = now
        if pending:
            pending -= 1
        elif tokens:
            rounds.append((0, 0))  # a plain step: no draft room left (or none drafted)
        tokens.append(chunk.tokens[0])
    if pending:
        raise AtlasError(f"llama-server's last round accepted {rounds[-1][1]} drafts but the stream ended {pending} token(s) short")
    return tokens, rounds


def streamed_with_gaps(chunks: list[Chunk]) -> bool:
    """Whether the server held back tokens from the stream (see the module's note)."""
    final = chunks[-1].timings
    return final is not None and sum(len(c.tokens) for c in chunks) < final.predicted_n


def rounds_with_gaps(chunks: list[Chunk], k: int, delta: Counters, n_tokens: int) -> list[tuple[int, int]]:
    """A generation's verify rounds when the stream held tokens back (the module's note), in no
    particular order. After g of its n_tokens tokens llama-server drafts min(k, n_tokens − g − 1)
    (its budget rule at p-min 0; a plain step where that is 0), so a generation is a path of
    accepted counts. Every chunk pins the path: the tokens a round emits all show the counters
    after its draft and its acceptance. The final chunk pins the end, and the /metrics deltas the
    totals (rounds, and rounds accepting more than i, per position i). The walk keeps, after each
    token count, the distinct sets of rounds that reach it through every pin (orders that give the
    same set are one state, so long gaps stay cheap). Exactly one set must reach the end, or the
    generation is refused. Plain steps are (0, 0)."""
    pins: dict[int, tuple[int, int]] = {}
    for chunk in chunks:  # the final chunk too: its counters hold a last round whose tokens were all held back
        if chunk.timings is None:
            continue
        now = (chunk.timings.draft_n, chunk.timings.draft_n_accepted)
        if pins.setdefault(chunk.tokens_predicted, now) != now:
            raise AtlasError(f"llama-server streamed two counter values, {pins[chunk.tokens_predicted]} and {now}, at token {chunk.tokens_predicted}")
    per_position = tuple(delta.accepted_per_position[:k]) + (0,) * (k - len(delta.accepted_per_position))
    if any(delta.accepted_per_position[k:]) or pins.get(1, (0, 0)) != (0, 0):
        raise AtlasError(f"llama-server's counters {delta} (and {pins.get(1)} at its first token) are not those of k = {k} rounds")
    # states after g tokens: (drafted, accepted, the rounds so far as a sorted tuple)
    states: list[set[tuple[int, int, tuple[tuple[int, int], ...]]]] = [set() for _ in range(n_tokens + 1)]
    states[1].add((0, 0, ()))
    for g in range(1, n_tokens):
        d = max(min(k, n_tokens - g - 1), 0)
        for drafted, accepted, rounds in states[g]:
            for a in range(d + 1):
                after = (drafted + d, accepted + a)
                if g + a + 1 <= n_tokens and all(pins.get(p, after) == after for p in range(g + 1, g + a + 2)):
                    states[g + a + 1].add((*after, tuple(sorted(rounds + ((d, a),)))))
        if len(states[g + 1]) > MAX_STATES:
            raise AtlasError(f"llama-server held back so many tokens that over {MAX_STATES} sets of rounds reach token {g + 1}; "
                             "the generation cannot be counted")
    found = [rounds for drafted, accepted, rounds in states[n_tokens]
             if (drafted, accepted, sum(1 for d, _ in rounds if d)) == (delta.drafted, delta.accepted, delta.rounds)
             and tuple(sum(1 for _, a in rounds if a > i) for i in range(k)) == per_position]
    if len(found) != 1:
        raise AtlasError(f"llama-server held tokens back from its stream, and {len(found) or 'no'} sets of rounds under its budget rule "
                         f"(k = {k}, {n_tokens} tokens) give its streamed counters and /metrics deltas {delta}: the generation cannot be counted")
    return list(found[0])


def run_stats(completion: Completion, k: int) -> RunStats:
    """A generation as our loop's RunStats: per-position counts from the rounds (plain, k = 0: none)."""
    if k == 0:
        return RunStats(completion.tokens, completion.seconds, [], [], len(completion.tokens) - 1)
    counts = RoundCounts(k)
    for drafted, accepted in completion.rounds:
        counts.observe(drafted, accepted)
    if counts.emitted != len(completion.tokens) - 1:
        raise AtlasError(f"llama-server's rounds emitted {counts.emitted} tokens, the output has {len(completion.tokens) - 1} after the first")
    return counts.stats(completion.tokens, completion.seconds)


def parse_event(line: str) -> Chunk | None:
    """One line of llama-server's event stream: a chunk, or None for a blank line or a comment (a
    line starting with ':', which server-sent events reserve for keep-alives: the server sends one
    while a slow step keeps it silent); AtlasError for anything else (a line that is no event, JSON
    that is not a completion chunk)."""
    line = line.strip()
    if not line or line.startswith(":"):
        return None
    if not line.startswith("data: "):
        raise AtlasError(f"llama-server streamed a line that is not an event: {line[:200]!r}")
    try:
        return Chunk.model_validate(json.loads(line[6:]))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise AtlasError(f"llama-server streamed malformed output ({str(exc).splitlines()[0]}): {line[:200]!r}") from None


def parse_metrics(text: str) -> Counters:
    """The speculative counters of llama-server's Prometheus text (absent counters are 0)."""
    def value(name: str) -> int:
        found = re.search(rf"^llamacpp:{name} ([0-9.e+]+)$", text, flags=re.M)
        return int(float(found.group(1))) if found else 0

    per_pos = {int(p): int(float(v)) for p, v in
               re.findall(r'^llamacpp:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\} ([0-9.e+]+)$', text, flags=re.M)}
    return Counters(value("spec_decode_num_draft_tokens_total"), value("spec_decode_num_accepted_tokens_total"),
                    value("spec_decode_num_drafts_total"), [per_pos.get(i, 0) for i in range(max(per_pos, default=-1) + 1)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NotReproduced(AtlasError):
    """A request with held-back tokens whose whole answer differed from its stream."""


class Server:
    """llama-server with `args` (everything after the model), as a context manager."""

    def __init__(self, binary: Path, gguf: Path, args: list[str]) -> None:
        self.port = free_port()
        self.args = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port), "--metrics", "--no-webui", *args]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="atlas-llama-server-", suffix=".log", delete=False)
        try:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                         env=engine_env())
        except OSError as exc:
            raise AtlasError(f"cannot start {binary}: {exc}") from None
        self._wait_ready()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tail(self, lines: int = 12) -> str:
        try:
            text = Path(self.log.name).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n    ".join(text[-lines:])

    def _died(self, during: str) -> AtlasError:
        code = self.proc.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited ({code})"
        return AtlasError(f"llama-server {how} during {during}; its log ({self.log.name}) ends:\n    {self.tail()}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._died("start-up")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.close()
        raise AtlasError(f"llama-server did not answer /health within {START_TIMEOUT:.0f} s; its log ends:\n    {self.tail()}")

    def _request(self, path: str, body: dict[str, Any] | None = None, timeout: float = 600) -> urllib.response.addinfourl:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            raise AtlasError(f"llama-server {path} answered {exc.code}: {exc.read()[:300]!r}") from None
        except (urllib.error.URLError, OSError) as exc:
            if self.proc.poll() is not None:
                raise self._died(path) from None
            raise AtlasError(f"llama-server {path}: {exc}") from None

    def metrics(self) -> Counters:
        with self._request("/metrics") as reply:
            return parse_metrics(reply.read().decode())

    def stream(self, body: dict[str, Any]) -> list[Chunk]:
        """POST /completion with streaming and per-token timings; every chunk validated."""
        chunks = []
        with self._request("/completion", {**body, "stream": True, "timings_per_token": True}) as reply:
            for raw in reply:
                chunk = parse_event(raw.decode(errors="replace"))
                if chunk is not None:
                    chunks.append(chunk)
        if not chunks or not chunks[-1].stop or chunks[-1].timings is None:
            raise AtlasError("llama-server's stream ended without its final chunk (stop, timings)")
        return chunks

    def whole(self, body: dict[str, Any]) -> tuple[list[int], Timings]:
        """The ids and timings of `body` answered unstreamed."""
        with self._request("/completion", {**body, "stream": False, "return_tokens": True}) as reply:
            try:
                answer = json.loads(reply.read())
                return [int(t) for t in answer["tokens"]], Timings.model_validate(answer["timings"])
            except (ValueError, KeyError, TypeError, ValidationError) as exc:
                raise AtlasError(f"llama-server's unstreamed answer is not one the atlas can read: {str(exc)[:200]}") from None

    def _with_gaps(self, body: dict[str, Any], chunks: list[Chunk], k: int, delta: Counters | None) -> Completion:
        """A generation whose stream lacks held-back tokens (the module's note)."""
        final = chunks[-1].timings
        assert final is not None
        tokens, again = self.whole(body)
        streamed = {c.tokens_predicted - 1: c.tokens[0] for c in chunks if len(c.tokens) == 1}
        if len(tokens) != final.predicted_n or any(tokens[i] != t for i, t in streamed.items() if i < len(tokens)) \
                or (again.draft_n, again.draft_n_accepted) != (final.draft_n, final.draft_n_accepted):
            raise NotReproduced("llama-server held tokens back from its stream, and the same request answered whole gave other "
                                "tokens or counts: the request is not reproducible, so its tokens cannot be recovered")
        if delta is None:
            return Completion(tokens, [(0, 0)] * (len(tokens) - 1), final.predicted_ms / 1000, final)
        if (delta.drafted, delta.accepted) != (final.draft_n, final.draft_n_accepted):
            raise AtlasError(f"llama-server's final timings (draft_n {final.draft_n}, accepted {final.draft_n_accepted}) disagree "
                             f"with its /metrics deltas {delta}")
        if len(tokens) != body["n_predict"]:  # the budget rule the rounds are walked under needs the whole budget spent
            raise AtlasError(f"llama-server held tokens back from its stream and stopped after {len(tokens)} of the {body['n_predict']} "
                             "tokens asked (ignore_eos): its rounds cannot be counted")
        return Completion(tokens, rounds_with_gaps(chunks, k, delta, len(tokens)), final.predicted_ms / 1000, final)

    def complete(self, body: dict[str, Any], k: int = 0) -> Completion:
        """One generation on a server that drafts k tokens a round (0: plain decoding); for a
        speculative one its stream, final timings and /metrics deltas must agree.

        A stream with held-back tokens is answered again whole (`_with_gaps`), and that answer can
        differ from the stream's: build 11434's drafts depend on the requests before (after a
        947-token request the same T = 1 request drafted 34 and accepted 12, after short ones 33 and
        13), so a re-ask that follows the stream is not the stream's twin. Then the request runs once
        more right after itself answered whole, so that the stream and its re-ask each follow the
        same request; a second difference is refused."""
        try:
            return self._complete(body, k)
        except NotReproduced:
            self.whole(body)
            return self._complete(body, k)

    def _complete(self, body: dict[str, Any], k: int) -> Completion:
        before = self.metrics() if k else None
        chunks = self.stream(body)
        if streamed_with_gaps(chunks):
            return self._with_gaps(body, chunks, k, self.metrics().minus(before) if before is not None else None)
        tokens, rounds = rounds_from_stream(chunks)
        final = chunks[-1].timings
        assert final is not None
        drafted = sum(d for d, _ in rounds)
        accepted = sum(a for _, a in rounds)
        if (final.draft_n, final.draft_n_accepted) != (drafted, accepted):
            raise AtlasError(f"llama-server's final timings (draft_n {final.draft_n}, accepted {final.draft_n_accepted}) disagree "
                             f"with its streamed rounds ({drafted}, {accepted})")
        if final.predicted_n != len(tokens):
            raise AtlasError(f"llama-server reports {final.predicted_n} tokens predicted and streamed {len(tokens)}")
        if before is not None:
            delta = self.metrics().minus(before)
            per_pos = [sum(1 for _, a in rounds if a > i) for i in range(len(delta.accepted_per_position))]
            mine = Counters(drafted, accepted, sum(1 for d, _ in rounds if d), per_pos)
            if delta != mine:
                raise AtlasError(f"llama-server's /metrics deltas {delta} disagree with its streamed rounds {mine}")
        return Completion(tokens, rounds, final.predicted_ms / 1000, final)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if self.proc.returncode in (0, -15):
            Path(self.log.name).unlink(missing_ok=True)  # kept only when something went wrong
