"""The LLM iteration (rules 3–5): every interactive stream's next token, interactive prompts in
chunks, and background work riding along in what the ITL budgets leave, within token, time and
KV budgets. Modelled on vLLM v1's `schedule()`: running sequences first, then waiting ones."""

from __future__ import annotations

from collections import Counter

from fairlane.policy.base import IterationBuilder
from fairlane.policy.lanes import INTERACTIVE, LaneChoice, Lanes, as_urgent, less_urgent, tighter
from fairlane.policy.plan import LlmPlan
from fairlane.policy.request import Kind, Priority, Request, Status


class LlmIteration(Lanes):
    def _plan_llm(self, choice: LaneChoice, now: float) -> LlmPlan | None:
        """Rules 3–5: running decodes, then prefill chunks, within token, time and KV budgets.

        A step owed to background (rule 8) carries background work and the interactive decodes
        (they never miss a token), but no interactive prompt: it is background's slice.
        """
        batch = IterationBuilder.after(self)
        preempted: list[str] = []
        if choice.owed:
            decodes = [r for r in self._by_urgency(interactive=True) if r.is_decode]
            held = self.held_tokens()
            decode_cost = self.cost.llm_s(0, len(decodes), 0, held) - self.cost.llm_s(0, 0, 0, held)
            batch.budget_s = self.config.slice_s
            limit_s = self.config.slice_s - decode_cost
            ceiling_s = self.config.arrival_wait_s - decode_cost
            self._schedule_background(batch, preempted, limit_s, now, ceiling_s)
            if not batch.chunks:
                return None  # background cannot run on this lane now: the next lane may
            self._schedule_interactive_decodes(batch, preempted)
            return batch.plan(preempted)
        self._schedule_interactive_decodes(batch, preempted)
        itl_limits = self._itl_limits(batch, now)
        promised = self._itl_limits(batch, now, paced=False)
        self._schedule_interactive_prefills(batch, preempted, itl_limits, promised, now)
        # Background rides along only in an iteration that carries no interactive prompt (its
        # TTFT is running) and only while the iteration still delivers every interactive token
        # when it is due; with no interactive work, the lane's budget bounds it.
        carries_prompt = any(c.priority.interactive and not c.decode for c in batch.chunks)
        if not carries_prompt:
            budget_s = choice.budget_s or self.config.slice_s
            limit_s = tighter(itl_limits[Priority.BACKGROUND], budget_s)
            batch.budget_s = limit_s
            self._schedule_background(batch, preempted, limit_s, now)
        if not batch.chunks:
            return None
        return batch.plan(preempted)

    def _itl_limits(
        self, batch: IterationBuilder, now: float, paced: bool = True
    ) -> dict[Priority, float | None]:
        """For each class, how long this iteration may run and still deliver, on time, the next
        token of every decode of that class or a more urgent one (rule 4); `paced`: a spoken
        reply's at its pace, else at its class's ITL target.

        The time is counted from each stream's last token, not from now: time already spent
        since then (an embedding step in the slack) is not spent twice.
        """
        remaining: dict[Priority, float] = {}
        for chunk in batch.chunks:
            request = self.requests[chunk.request_id]
            budget = (
                self._itl_budget(request) if paced else self.config.itl_budget_s(request.priority)
            )
            if not chunk.decode or budget is None or request.last_token_at is None:
                continue
            left = request.last_token_at + budget - now
            remaining[chunk.priority] = min(remaining.get(chunk.priority, left), left)
        limits: dict[Priority, float | None] = {}
        tightest: float | None = None
        for priority in Priority:
            if priority in remaining:
                left = remaining[priority]
                tightest = left if tightest is None else min(tightest, left)
            limits[priority] = tightest
        return limits

    def _prompt_limit(
        self,
        batch: IterationBuilder,
        paced: dict[Priority, float | None],
        promised: dict[Priority, float | None],
        priority: Priority,
    ) -> float:
        """How long an iteration that carries a prompt chunk of `priority` may run.

        Within the arrival wait and every stream's paced ITL limit (a spoken reply keeps its
        pace). But a chunk squeezed below its own fixed cost crawls: on the H200 a prompt chunk
        costs ~10 ms before its first token while a paced voice decode allows ~6 ms, so a chat
        prompt beside a spoken reply went 16 tokens a step. Then the iteration may grow until
        the chunk's tokens cost as much as its fixed cost, as long as every stream's ITL target
        (not its pace) still holds: the spoken reply's next token comes a few ms later once.
        """
        wait_s = self.config.arrival_wait_s
        limit = tighter(paced[priority], wait_s)
        if batch.prefill:
            return limit  # the chunk's fixed cost is paid: more tokens are only token cost
        worth = batch.predicted_s() + 2 * self.cost.prompt_fixed_s()
        if limit < worth:
            limit = min(worth, tighter(promised[priority], wait_s))
        return limit

    def _by_urgency(self, interactive: bool) -> list[Request]:
        return sorted(
            (r for r in self.running.values() if r.priority.interactive is interactive),
            key=lambda r: (r.priority, r.order),
        )

    def _schedule_interactive_decodes(self, batch: IterationBuilder, preempted: list[str]) -> None:
        """Every interactive stream gets its next token in every iteration (rule 3)."""
        for request in self._by_urgency(interactive=True):
            if batch.full:
                return
            if request.status is Status.RUNNING and request.is_decode:
                tokens = request.computed_tokens + 1
                if self._make_room(request, tokens, batch, preempted, as_urgent(request)):
                    batch.add(request, 1)

    def _schedule_interactive_prefills(
        self,
        batch: IterationBuilder,
        preempted: list[str],
        itl_limits: dict[Priority, float | None],
        promised: dict[Priority, float | None],
        now: float,
    ) -> None:
        """Rule 4 for interactive prompts, class by class, members taking turns (rule 6).

        An interactive prompt is chunked too, to `arrival_wait_s`: a voice command that arrives
        during a chat prompt's prefill waits for one chunk, not the whole prompt.
        """
        for priority in INTERACTIVE:
            waiting_blocked = False
            for request in self._member_turns(priority):
                if request.id in preempted:
                    continue
                # Asked for each prompt: once the step carries a prompt chunk, it may no longer
                # grow to a chunk's worth.
                limit = self._prompt_limit(batch, itl_limits, promised, priority)
                if request.status is Status.RUNNING:
                    self._add_prefill(request, batch, preempted, limit)
                elif not waiting_blocked and self._member_may_start(request, batch):
                    # A waiting prompt that cannot start now keeps its place: none behind it
                    # in the queue starts before it.
                    waiting_blocked = not self._add_prefill(request, batch, preempted, limit, now)

    def _member_turns(self, priority: Priority) -> list[Request]:
        """Rule 6 within a step: a class's prompts, its half-done ones and those waiting (in
        VTC order), with the members taking turns.

        Each prompt is ranked by how many prompts of its member's in this class come before it
        (half-done ones, then its member's waiting ones ahead of it; a reply being decoded
        takes no turn at the prompt); among equal ranks the prompt with the least left to
        prefill goes first (then half-done before waiting, then by age). One member keeping
        four long prompts going therefore no longer holds another member's new turn behind
        all four, nor behind the whole of one: a short turn of someone else is prefilled
        first. With one member (or none named) a class's order is the old one: half-done
        prompts by age, then waiting ones; the classes go voice first, so a new spoken command's
        prompt now goes before a half-done chat prompt (before, every half-done prompt went
        first).
        """
        half_done = sorted(
            (r for r in self.running.values() if r.priority is priority and not r.is_decode),
            key=lambda r: r.order,
        )
        queue = self.waiting[Kind.LLM, priority]
        depth: Counter[str] = Counter()
        ranked: list[tuple[int, int, int, int, Request]] = []
        for request in half_done:
            rank = depth[request.client]
            ranked.append((rank, request.remaining_prefill, 0, request.order, request))
            depth[request.client] += 1
        for position, request in enumerate(queue.in_service_order(self.config.max_num_seqs)):
            rank = depth[request.client]
            ranked.append((rank, request.remaining_prefill, 1, position, request))
            depth[request.client] += 1
        ranked.sort(key=lambda entry: entry[:4])
        return [entry[4] for entry in ranked]

    def _member_may_start(self, request: Request, batch: IterationBuilder) -> bool:
        """Rule 6 beside rule 5: a member who already runs a sequence of an interactive class
        starts another only when all of its prompt fits beside the watermark (as a background
        prompt does), so the next turn of someone else in the class finds KV free. KV that
        less urgent work holds counts as free: the new sequence may take it (rule 5)."""
        if not request.priority.interactive or not any(
            r.client == request.client and r.priority is request.priority
            for r in self.running.values()
        ):
            return True
        evictable = sum(
            self.kv.held.get(r.id, 0)
            for r in self.running.values()
            if r.priority > request.priority and r.id not in batch.scheduled
        )
        needed = self.kv.extra_blocks(request.id, request.kv_tokens(request.target_tokens))
        return needed <= self.kv.free_blocks + evictable - self.config.kv_reserve_blocks

    def _schedule_background(
        self,
        batch: IterationBuilder,
        preempted: list[str],
        limit_s: float,
        now: float,
        ceiling_s: float | None = None,
    ) -> None:
        """Background decodes, then background prefill, while the iteration fits in `limit_s`.

        `ceiling_s` (an owed slice, rule 8): a prompt chunk that `limit_s` leaves below its
        worth may grow up to it (`_worth_room`).
        """
        running = self._by_urgency(interactive=False)
        for request in running:
            if batch.full:
                return
            if request.status is not Status.RUNNING or not request.is_decode:
                continue
            extra = batch.predicted_s(decodes=1, context=request.computed_tokens + 1)
            if batch.chunks and extra > limit_s:
                return
            tokens = request.computed_tokens + 1
            if self._make_room(request, tokens, batch, preempted, as_urgent(request)):
                batch.add(request, 1)
        prefilling = [r for r in running if r.status is Status.RUNNING and not r.is_decode]
        for request in prefilling:
            if not self._add_prefill(request, batch, preempted, limit_s, ceiling_s=ceiling_s):
                return
        queue = self.waiting[Kind.LLM, Priority.BACKGROUND]
        reserve = self.config.kv_reserve_blocks
        while (waiting := queue.peek()) is not None and waiting.id not in preempted:
            # Rule 5: a background prompt starts only when all of it fits beside the
            # watermark, so the next interactive arrival does not preempt it at once. (It
            # always can eventually: admission refused any that could never fit.)
            if not self.kv.can_hold(waiting.id, waiting.kv_tokens(waiting.target_tokens), reserve):
                return
            if not self._add_prefill(waiting, batch, preempted, limit_s, now, ceiling_s):
                return

    def _worth_room(self, batch: IterationBuilder, request: Request, ceiling_s: float) -> int:
        """Prompt tokens of `request`'s next chunk whose own cost is `owed_chunk_worth` times
        the chunk's fixed cost, in an iteration no longer than `ceiling_s`.

        Rule 8 on a slow host: a background prompt's fixed cost (~55 ms on 2 CPU cores beside
        long summaries) alone fills a 50 ms slice, so an owed slice kept to it ran 1-token
        chunks and spent the share it was owed on overhead. Growing the one owed step keeps
        rule 2's promise in its own words (an arrival waits for one background step) while the
        step does work worth its cost.
        """
        worth = self.config.owed_chunk_worth
        if worth <= 0:
            return 0
        fixed_s = batch.chunk_fixed_s(request)
        worth_s = batch.predicted_s() + (1.0 + worth) * fixed_s
        # The fewest tokens that cost at least that (one past what fits), within the ceiling.
        fewest = batch.prefill_room(worth_s, request) + 1
        return min(fewest, batch.prefill_room(ceiling_s, request))

    def _add_prefill(
        self,
        request: Request,
        batch: IterationBuilder,
        preempted: list[str],
        budget_s: float | None,
        now: float | None = None,
        ceiling_s: float | None = None,
    ) -> bool:
        """Add the largest chunk of `request`'s prompt that the budgets allow.

        Progress is guaranteed: the first interactive prompt of an iteration gets at least
        `min_prefill_chunk` tokens even when the decodes already fill the time budget, and a
        background prompt in an otherwise empty one `background_min_chunk` (1: the step keeps
        to its bound wherever one token fits it, rule 2). `now` is given for a waiting request,
        which also needs a sequence slot: an interactive one takes a background sequence's
        slot (rule 5). `ceiling_s`: an owed background slice, whose chunk may grow to its worth.
        """
        room = batch.prefill_room(budget_s, request)
        if ceiling_s is not None:
            room = max(room, self._worth_room(batch, request, ceiling_s))
        if request.priority.interactive:
            least = self.config.min_prefill_chunk
            guaranteed = not batch.chunks or not batch.prefill
        else:
            least = self.config.background_min_chunk
            guaranteed = not batch.chunks
        if room < least:
            if not guaranteed:
                return False
            room = min(least, batch.token_room)
        num_tokens = min(request.remaining_prefill, room)
        if num_tokens <= 0 or (request.status is Status.WAITING and batch.full):
            return False
        positions = request.computed_tokens + num_tokens
        if request.status is Status.WAITING:
            # A new sequence only takes KV, or a slot, from strictly less urgent classes.
            slot_victim: Request | None = None
            if len(self.running) >= self.config.max_num_seqs:
                victims = self._victims(request, batch, less_urgent(request))
                if not victims:
                    return False
                slot_victim = victims[0]
            if not self._make_room(
                request, positions, batch, preempted, less_urgent(request), slot_victim
            ):
                return False
            assert now is not None
            self._dispatch(request, now)
        elif not self._make_room(request, positions, batch, preempted, as_urgent(request)):
            return False
        batch.add(request, num_tokens)
        return True
