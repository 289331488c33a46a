"""Planted bugs in the continuous-batching decoder's step: EOS and limit finishing, stop strings, which rows
go on and how the slab compacts them, each request's own sampling settings, the one host transfer."""

D = "tentalis_pipelines/inference/batch_decoder.py"
B = "tentalis_pipelines/inference/transformers_backend.py"
TD = ["tests/test_batch_decoder.py"]
TS = ["tests/unit/test_slab_cache.py"]

MUTANTS = [
    {"id": "decoder-eos-ignored", "file": D, "find": "            if ids[j] in self.eos or hit:\n",
     "replace": "            if hit:\n", "tests": TD, "why": "a row that samples EOS decodes on past it"},
    {"id": "decoder-limit-off-by-one", "file": D, "find": "            elif len(c.token_ids) >= req.max_new_tokens:\n",
     "replace": "            elif len(c.token_ids) > req.max_new_tokens:\n", "tests": TD,
     "why": "every row decodes one token more than max_new_tokens"},
    {"id": "decoder-stop-tail-ignored", "file": D, "find": "                hit = any(s in tail for s in stops)\n",
     "replace": "                hit = False\n", "tests": TD, "why": "without tracked text (the rollouts) a stop string never ends a row"},
    {"id": "decoder-stop-text-not-cut", "file": D, "find": "                    text, hit = text[:cut], True\n",
     "replace": "                    hit = True\n", "tests": TD, "why": "a streamed choice's text keeps the stop string"},
    {"id": "decoder-finished-rows-stay", "file": D, "find": "        if len(keep) < len(self.rows):\n            self._select(keep)\n",
     "replace": "", "tests": TD, "why": "finished rows stay in the batch and go on recording tokens"},
    {"id": "decoder-keep-index-not-offset", "file": D, "find": "            keep += [a + j for j in self._record(req, self.rows[a:b], ids[a:b], chosen[a:b])]\n",
     "replace": "            keep += [j for j in self._record(req, self.rows[a:b], ids[a:b], chosen[a:b])]\n", "tests": TD,
     "why": "a later request's rows that go on are taken as the first request's rows"},
    {"id": "decoder-live-count-one-per-step", "file": D, "find": "        req.live -= len(finished)\n",
     "replace": "        req.live -= min(1, len(finished))\n", "tests": TD,
     "why": "two choices ending at one step leave the request open forever (its on_done never comes)"},
    {"id": "decoder-one-span-for-all", "file": D,
     "find": "            if j == len(self.rows) or self.rows[j].req is not self.rows[start].req:\n",
     "replace": "            if j == len(self.rows):\n", "tests": TD,
     "why": "every row is sampled with the first request's temperature, top-p and generator"},
    {"id": "decoder-top-p-ignored", "file": D,
     "find": "        sampled = [sample_tokens(logits[a:b], req.temperature, req.top_p, req.generator) for req, a, b in spans]\n",
     "replace": "        sampled = [sample_tokens(logits[a:b], req.temperature, 1.0, req.generator) for req, a, b in spans]\n",
     "tests": TD, "why": "a request's top_p is dropped once it is in the running batch"},
    {"id": "decoder-logprob-of-wrong-row", "file": D, "find": "            c.logprobs.append(chosen[j])\n",
     "replace": "            c.logprobs.append(chosen[0])\n", "tests": TD, "why": "every row records its request's first row's log-prob"},
    {"id": "decoder-logprobs-rounded-in-transfer", "file": D,
     "find": "    host = torch.stack([tokens.to(torch.float64), logps.to(torch.float64)]).cpu()\n",
     "replace": "    host = torch.stack([tokens.to(torch.float64), logps.to(torch.bfloat16).to(torch.float64)]).cpu()\n", "tests": TD,
     "why": "the log-probs lose precision on their way to the host: the trainer's old-policy ratio is off"},
    {"id": "decoder-token-ids-through-float32", "file": D,
     "find": "    host = torch.stack([tokens.to(torch.float64), logps.to(torch.float64)]).cpu()\n",
     "replace": "    host = torch.stack([tokens.to(torch.float32).to(torch.float64), logps.to(torch.float64)]).cpu()\n", "tests": TD,
     "why": "token ids pass through float32",
     "equivalent": "float32 holds every integer below 2**24 exactly, and vocabularies are far smaller (49,152 here)"},
    {"id": "slab-rows-in-place-misjudged", "file": D, "find": "        first = next((j for j, k in enumerate(keep) if k != j), m)\n",
     "replace": "        first = next((j for j, k in enumerate(keep) if k > j + 1), m)\n", "tests": TS + TD,
     "why": "a row that moves up by one place is taken as in place: the row that left stays in its slot"},
    {"id": "greedy-takes-argmin", "file": B, "find": "        nxt = logits.argmax(-1)\n", "replace": "        nxt = logits.argmin(-1)\n",
     "tests": TD, "why": "temperature 0 decodes the least likely token"},
]
