"""The steps of the batching engines (speech, synthesis, embeddings) and the batch window that
decides when waiting for one more item pays (rule 7)."""

from __future__ import annotations

from fairlane.policy.lanes import LaneChoice, Lanes
from fairlane.policy.plan import EmbedPlan, IdlePlan, SttPlan, TtsPlan
from fairlane.policy.request import Kind, Request


class BatchSteps(Lanes):
    def _hold_window(self, choice: LaneChoice, now: float) -> IdlePlan | None:
        """Rule 7: a batching lane waits for more work only when waiting is predicted to pay.

        It pays when the device is otherwise idle (the caller checks that this lane and class
        is the only work), the next arrival of the same lane and class is forecast inside the
        class window, and the fixed step cost the newcomer would share is larger than what
        holding adds: the wait, for the n queued and the newcomer, and the newcomer's own share
        of the batch, for the n queued. (Total time to result falls when
        (n + 1) · wait + n · per-item cost < fixed cost.)
        """
        if choice.kind in (Kind.LLM, Kind.TTS):
            # Sequences join a running LLM batch between iterations anyway; a reply's sentences
            # come one by one as the LLM writes them, so waiting for the next pays nothing.
            return None
        queue = self.waiting[choice.kind, choice.priority]
        oldest = queue.oldest_arrival()
        window_s = self.config.batch_window_ms[choice.priority] / 1000.0
        max_batch = (
            self.config.stt_max_batch if choice.kind is Kind.STT else self.config.embed_max_batch
        )
        if oldest is None or window_s <= 0 or len(queue) >= max_batch:
            return None
        close = oldest + window_s
        expected = self.arrivals[choice.kind, choice.priority].expected_next(now)
        if now >= close or expected is None or not now < expected <= close:
            return None
        waiting = list(queue)
        if choice.kind is Kind.STT:
            audio = sum(r.audio_s for r in waiting)
            mean = audio / len(waiting)
            per_item = self.cost.stt_s(len(waiting) + 1, audio + mean) - self.cost.stt_s(
                len(waiting), audio
            )
        else:
            longest = max(r.prompt_tokens for r in waiting)
            per_item = self.cost.embed_s(longest * (len(waiting) + 1)) - self.cost.embed_s(
                longest * len(waiting)
            )
        added = (len(waiting) + 1) * (expected - now) + len(waiting) * per_item
        if added >= self.cost.fixed_s(choice.kind):
            return None
        # Wake when the arrival is due: if it has not come by then, the forecast is overdue
        # and the queue runs without it.
        return IdlePlan(wake_at=min(close, expected), reason="batch window")

    def _plan_stt(self, choice: LaneChoice, now: float) -> SttPlan | None:
        """One batch of utterances of one class; a background batch stays within its slice,
        and an utterance joins only where joining pays (`_joining_pays`)."""
        queue = self.waiting[Kind.STT, choice.priority]
        taken: list[Request] = []
        audio_s = 0.0
        while len(taken) < self.config.stt_max_batch and (request := queue.peek()) is not None:
            cost = self.cost.stt_s(len(taken) + 1, audio_s + request.audio_s)
            if taken and choice.budget_s is not None and cost > choice.budget_s:
                break
            if taken and not self._joining_pays(len(taken), audio_s, request, len(queue) - 1):
                break
            self._dispatch(request, now)
            taken.append(request)
            audio_s += request.audio_s
        if not taken:
            return None
        return SttPlan(
            request_ids=tuple(r.id for r in taken),
            priority=choice.priority,
            audio_s=audio_s,
            predicted_s=self.cost.stt_s(len(taken), audio_s),
            budget_s=choice.budget_s,
        )

    def _joining_pays(self, taken: int, audio_s: float, request: Request, behind: int) -> bool:
        """Whether `request` joining a speech batch of `taken` utterances (`audio_s` of audio)
        lowers the summed wait of everyone it changes, `behind` more queued after it.

        Joining makes the batch dearer by g, so each of the `taken` waits g more; the newcomer
        and those behind it no longer wait for its own step (a, alone) after the batch, so
        each waits g - a more. Where a speech step shares a fixed cost (a GPU) a batch pays,
        the more so the longer the queue; where a batch costs what its utterances do one by
        one (Whisper on a 2-core CPU: 1,634 ms for two against 705 for one), two commands
        spoken at once made the first speaker wait for the second's words too.
        """
        grown = self.cost.stt_s(taken + 1, audio_s + request.audio_s) - self.cost.stt_s(
            taken, audio_s
        )
        alone = self.cost.stt_s(1, request.audio_s)
        return taken * grown + (behind + 1) * (grown - alone) < 0

    def _plan_tts(self, choice: LaneChoice, now: float) -> TtsPlan | None:
        """Sentences to speak, oldest (by VTC) first; each is one bounded unit of work."""
        queue = self.waiting[Kind.TTS, choice.priority]
        taken: list[Request] = []
        longest = 0
        while len(taken) < self.config.tts_max_batch and (request := queue.peek()) is not None:
            cost = self.cost.tts_s(max(longest, request.prompt_tokens) * (len(taken) + 1))
            if taken and choice.budget_s is not None and cost > choice.budget_s:
                break
            self._dispatch(request, now)
            taken.append(request)
            longest = max(longest, request.prompt_tokens)
        if not taken:
            return None
        return TtsPlan(
            request_ids=tuple(r.id for r in taken),
            priority=choice.priority,
            phonemes=longest * len(taken),
            predicted_s=self.cost.tts_s(longest * len(taken)),
            budget_s=choice.budget_s,
        )

    def _plan_embed(self, choice: LaneChoice, now: float) -> EmbedPlan | None:
        """One micro-batch in a padded-token budget (rule 2), texts of similar length together.

        The head of the fair queue always goes; the rest are picked from the next few in service
        order by closeness in length to it, which cuts padding without starving long texts.
        """
        cfg = self.config
        queue = self.waiting[Kind.EMBED, choice.priority]
        token_budget = cfg.embed_max_batch_tokens
        if choice.budget_s is not None:
            token_budget = min(token_budget, self.cost.embed_tokens_within(choice.budget_s))
        candidates = queue.in_service_order(4 * cfg.embed_max_batch)
        if not candidates:
            return None
        head = candidates[0]
        candidates.sort(key=lambda r: (abs(r.prompt_tokens - head.prompt_tokens), r.arrival))
        batch: list[Request] = []
        longest = 0
        for request in candidates:
            if len(batch) >= cfg.embed_max_batch:
                break
            padded = max(longest, request.prompt_tokens) * (len(batch) + 1)
            if batch and padded > token_budget:
                continue
            batch.append(request)
            longest = max(longest, request.prompt_tokens)
        for request in batch:
            self._dispatch(request, now)
        batch.sort(key=lambda r: r.prompt_tokens)
        return EmbedPlan(
            request_ids=tuple(r.id for r in batch),
            priority=choice.priority,
            padded_tokens=longest * len(batch),
            predicted_s=self.cost.embed_s(longest * len(batch)),
            budget_s=choice.budget_s,
        )
