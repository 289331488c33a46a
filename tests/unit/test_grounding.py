"""The grounding check: the rules by hand, the synthetic corruptions' gold spans, the session split, and the
flagged-span policy in training (penalize: exactly those tokens, exactly that amount; block: exactly that turn)."""

from __future__ import annotations

import pytest

from tentalis_pipelines.reviewers.grounding import (
    Evidence,
    Flag,
    FlagError,
    check_answer,
    unit_of,
    validate_flag,
)
from tentalis_pipelines.reviewers.grounding_data import Pair, make_sessions, split_by_session
from tentalis_pipelines.reviewers.grounding_tagger import (
    choose_threshold,
    combine,
    positive_weight,
    span_counts,
    spans_from_tokens,
    tagger_loss,
)
from tentalis_pipelines.training.grounding_policy import GroundingFlagError, apply_flags, chars_to_tokens
from tentalis_pipelines.training.trainer import TrainSample

CONTEXT = ('{"city": "San Diego", "temp_f": 72.41, "humidity_pct": 65, "date": "2024-03-05", "wind_mph": 8}\n'
           "$ ls -l /home/ana/reports\n-rw-r--r-- 1 ana ana 326K Mar  5 14:30 q1_summary.csv\n"
           "Order ORD-10023 total 1250.50 USD shipped 03/07/2024 via UPS to Maria Lopez")


def kinds(answer: str) -> list[tuple[str, str]]:
    return [(f.kind, f.text) for f in check_answer(answer, CONTEXT)]


def test_a_faithful_restatement_is_not_flagged():
    # 1,250.50 = 1250.50, 3.50-style trailing zeros, 72 and 72.4 rounded from 72.41, dates in four formats, 2:30 PM = 14:30.
    for answer in ["The weather in San Diego on March 5, 2024 is 72°F (72.4 degrees Fahrenheit) with 65% humidity and wind of 8 mph.",
                   "Order ORD-10023 for Maria Lopez totals $1,250.5 and shipped on 2024-03-07 via UPS.",
                   "On 7 March 2024 UPS shipped order ORD-10023; q1_summary.csv in /home/ana/reports is 326 KB, modified Mar 5 at 2:30 PM.",
                   "San Diego: 03/05/2024, wind 8 mph."]:
        assert check_answer(answer, CONTEXT) == [], answer


def test_each_kind_is_flagged_with_its_exact_span():
    answer = "In San Jose on March 6, 2024 it is 75°F; order ORD-10024 went via FedEx at 3:30 PM to /home/ana/report/q2.csv."
    flags = check_answer(answer, CONTEXT)
    assert [(f.kind, f.text) for f in flags] == [
        ("entity", "San Jose"), ("date", "March 6, 2024"), ("number", "75°F"), ("entity", "ORD-10024"),
        ("entity", "FedEx"), ("time", "3:30 PM"), ("path", "/home/ana/report/q2.csv")]
    for f in flags:
        assert answer[f.start:f.end] == f.text


def test_a_listed_file_under_another_folder_is_flagged():
    assert kinds("q1_summary.csv is 326 KB.") == []
    assert kinds("See /home/bob/q1_summary.csv.") == [("path", "/home/bob/q1_summary.csv")]


def test_a_tool_call_s_closing_tag_is_no_path():
    # The text a model writes for a tool call (how the gateway lands a template without tool support).
    call = '<tool_call>{"name": "ls", "arguments": {"path": "/home/ana/reports"}}</tool_call><|im_end|>'
    assert kinds(call) == []
    assert kinds('<tool_call>{"name": "cat", "arguments": {"path": "/home/bob/notes.txt"}}</tool_call>') == [
        ("path", "/home/bob/notes.txt")]  # a path inside the call is still checked


def test_a_number_the_context_gives_in_another_unit_is_a_unit_flag():
    ctx = "wind: 8 mph, humidity 65"
    assert kinds_of("The humidity is 65% and the wind 8 km/h.", ctx) == [("unit", "8 km/h")]
    assert kinds_of("The wind is 8 mph.", ctx) == []
    assert kinds("The wind is 8 km/h.") == []  # the context's 8 carries no unit: nothing to contradict


def test_number_normalisation():
    ctx = "total: 1000 items, price 3.50, ratio 0.25"
    assert check_answer("1,000 items at 3.5 each, ratio .25 aside 0.250", ctx) == []
    assert [f.text for f in check_answer("1,001 items at 3.55", ctx)] == ["1,001 items", "3.55"]


def test_dates_compare_across_formats_and_years():
    ctx = "due 2024-03-05"
    for ok in ["March 5", "Mar 5th", "5 March 2024", "03/05/2024", "05/03/2024", "2024-03-05"]:
        assert check_answer(f"It is due {ok}.", ctx) == [], ok
    assert kinds_of("It is due March 5, 2025.", ctx) == [("date", "March 5, 2025")]
    assert kinds_of("It is due 2024-03-06.", ctx) == [("date", "2024-03-06")]


def kinds_of(answer, ctx):
    return [(f.kind, f.text) for f in check_answer(answer, ctx)]


def test_names_are_case_insensitive_and_plain_words_are_not_names():
    ctx = "customer: maria lopez; carrier: ups"
    assert check_answer("Unfortunately Maria Lopez's parcel left via UPS.", ctx) == []
    assert kinds_of("The parcel for Mario Lopez left via UPS.", ctx) == [("entity", "Mario Lopez")]


def test_a_malformed_flag_is_refused_clearly():
    with pytest.raises(FlagError, match="outside the 5-character text"):
        validate_flag(Flag(3, 9, "number", "x", "lo"), "hello")
    with pytest.raises(FlagError, match="reads 'el', not the flagged 'xx'"):
        validate_flag(Flag(1, 3, "number", "x", "xx"), "hello")
    with pytest.raises(FlagError, match="is not one of"):
        validate_flag(Flag(1, 3, "colour", "x", "el"), "hello")



def test_each_flag_s_reason_names_the_claim_and_what_the_context_lacks():
    answer = "In San Jose on March 6, 2024 it is 75°F; order ORD-10024 went via FedEx at 3:30 PM to /home/ana/report/q2.csv."
    assert [f.reason for f in check_answer(answer, CONTEXT)] == [
        "'San Jose' is not in the context", "no date in the context is 'March 6, 2024'", "75 is not a number of the context",
        "'ORD-10024' is not in the context", "'FedEx' is not in the context", "no time in the context is '3:30 PM'",
        "the path '/home/ana/report/q2.csv' is not in the context"]
    # Several units for one number are listed, sorted, in the reason.
    assert [(f.kind, f.text, f.reason) for f in check_answer("It weighs 8 kg.", "8 mph and 8 km")] == [
        ("unit", "8 kg", "the context gives 8 in km, mph, not kg")]


def test_e_mail_addresses_are_names_checked_whole():
    ctx = "reply to ana@example.com before 2024-03-05"
    answer = "Write to ana@example.com or bob@example.org by 2024-03-06."
    assert [(f.kind, f.text, f.reason) for f in check_answer(answer, ctx)] == [
        ("entity", "bob@example.org", "the address 'bob@example.org' is not in the context"),
        ("date", "2024-03-06", "no date in the context is '2024-03-06'")]
    assert check_answer("Mail ana@example.com.", ctx) == []


def test_the_context_may_be_several_passages_or_its_evidence():
    passages = ["Order shipped via UPS", "2024-03-05", "Maria\n  Lopez", "Pat O’Brien", "/home/ana/a.txt"]
    answer = "Shipped 2024-03-05 to Maria Lopez and Pat O'Brien; see a.txt."
    assert check_answer(answer, passages) == []  # each passage counts; line breaks and curly apostrophes are not news
    wrong = "Shipped 2024-03-06 to Maria Lopez; see b.txt."
    flags = check_answer(wrong, passages)
    assert [(f.kind, f.text) for f in flags] == [("date", "2024-03-06"), ("path", "b.txt")]
    assert check_answer(wrong, Evidence.of(passages)) == flags  # indexed once, checked the same


def test_slash_iso_and_named_dates_at_month_and_day_edges():
    # (answer, context): each the same calendar day, at the first and last month and day.
    same = [("01/20/2024", "2024-01-20"), ("12/20/2024", "2024-12-20"), ("03/01/2024", "2024-03-01"),
            ("01/31/2024", "2024-01-31"), ("20/01/2024", "2024-01-20"), ("20/12/2024", "2024-12-20"),
            ("01/05/2024", "2024-05-01"), ("31/12/2024", "2024-12-31"), ("03/05/24", "2024-03-05"),
            ("2024-01-15", "January 15, 2024"), ("2024-12-15", "Dec 15 2024"), ("2024-03-01", "1 March 2024"),
            ("2024-01-31", "Jan. 31st, 2024"), ("Sept 30", "2024-09-30")]
    for answer, ctx in same:
        assert check_answer(f"Due {answer}.", f"due {ctx}") == [], (answer, ctx)
    # A four-digit year is the year as written, not this century's: 0024 is not 2024.
    assert kinds_of("Due 03/05/0024.", "due 2024-03-05") == [("date", "03/05/0024")]
    assert kinds_of("Due 03/05/25.", "due 2024-03-05") == [("date", "03/05/25")]


def test_an_impossible_date_is_no_date_and_its_numbers_are_checked():
    for answer in ["13/13/2024", "01/32/2024", "32/12/2024", "00/05/2024", "2024-13-05", "2024-01-32", "2024-00-10",
                   "2024-01-00"]:
        got = kinds_of(f"Due {answer}.", "nothing here")
        assert got and {k for k, _ in got} == {"number"}, (answer, got)
    # An impossible date does not stop the dates after it from being checked.
    assert kinds_of("From 45/67/2024 to 01/02/2025.", "from 2024-01-02") == [
        ("number", "45"), ("number", "67"), ("number", "2024"), ("date", "01/02/2025")]
    # Nor does a date inside a link (a link is no claim).
    assert kinds_of("See https://x.org/2024-03-05 and 2024-03-09.", "2024-03-05") == [("date", "2024-03-09")]


def test_times_at_noon_midnight_and_am_pm_edges():
    same = [("3 PM", "15:00"), ("1:15 pm", "13:15"), ("12:30", "12:30 PM"), ("12:00", "12 PM"), ("00:00", "12 AM"),
            ("09:00", "9 AM"), ("9 a.m.", "09:00"), ("11:59 PM", "23:59")]
    for answer, ctx in same:
        assert check_answer(f"It starts at {answer} sharp.", f"start {ctx}") == [], (answer, ctx)
    other = [("2:00 PM", "14:30"), ("12:00", "12 AM"), ("00:00", "12 PM"), ("9 PM", "09:00"), ("13:00", "13:00 PM")]
    for answer, ctx in other:
        assert kinds_of(f"It starts at {answer} sharp.", f"start {ctx}") == [("time", answer)], (answer, ctx)
    for answer in ["25:00", "24:00", "10:60", "13 PM", "0 PM"]:  # not times: their numbers are the claims
        got = kinds_of(f"It starts at {answer} sharp.", "nothing here")
        assert got[0] == ("number", answer.split(":")[0].split()[0]) and "time" not in {k for k, _ in got}, (answer, got)
    assert kinds_of("From 25:00 to 3:30 PM.", "from 15:30") == [("number", "25"), ("number", "00")]
    assert kinds_of("From 25:00 to 4:30 PM.", "from 15:30") == [("number", "25"), ("number", "00"), ("time", "4:30 PM")]


def test_units_by_any_spelling():
    table = [("°F", "degF"), ("° f", "degF"), ("degrees  Fahrenheit", "degF"), ("Degrees Celsius", "degC"), ("KM/H", "kmh"),
             (" USD ", "usd"), ("$", "usd"), ("GiB", "gb"), (None, None), ("", None), ("parsecs", None)]
    assert [unit_of(raw) for raw, _ in table] == [unit for _, unit in table]
    assert kinds_of("It is 72° F.", "72 C") == [("unit", "72° F")]
    assert kinds_of("The fee is $5.", "fee 5 EUR") == [("unit", "$5")]  # the span starts at the currency sign
    assert kinds_of("The fee is 5 EUR.", "fee $5") == [("unit", "5 EUR")]


def test_a_half_rounds_either_way_and_long_numbers_round_too():
    ctx = "rate 2.5, temp 72.45, balance 1000000000000000000000000000000.50 wei"
    for ok in ["3", "2", "72.5", "72.4", "1000000000000000000000000000001 wei", "1000000000000000000000000000000.5 wei"]:
        assert check_answer(f"It is {ok}.", ctx) == [], ok
    assert kinds_of("It is 72.6 or 1.", ctx) == [("number", "72.6"), ("number", "1")]  # no rounding of 72.45 or 2.5


def test_zero_is_a_number_like_any_other():
    assert kinds_of("0 items failed.", "1 item failed") == [("number", "0 items")]
    assert check_answer("0 items failed.", "0 items failed") == []


def test_numbers_next_to_dates_and_identifiers_in_the_context():
    ctx = "on 2024-03-02 order ORD10023: wind 8 mph, temp 72.41"
    assert check_answer("Order 10023: temp 72.4, wind 8 mph.", ctx) == []  # digits of an identifier; rounding
    assert kinds_of("Wind 8 km/h.", ctx) == [("unit", "8 km/h")]
    assert kinds_of("Wind 2 mph.", ctx) == [("number", "2 mph")]  # the day of a date is no quantity


def test_list_markers_open_a_line_and_numbers_elsewhere_are_claims():
    ctx = "total 45 USD"
    assert kinds_of("1. Paid 46 USD\n2. Shipped\n  3) Done\n\t4 . Closed", ctx) == [("number", "46 USD")]
    assert kinds_of("$5. That is the fee.", ctx) == [("number", "$5")]
    assert kinds_of("The total was 3. Then it shipped.", ctx) == [("number", "3")]
    assert kinds_of("The total was 3. Then it shipped.\nDone.", ctx) == [("number", "3")]  # a later line is no matter
    assert kinds_of("Paid 45 USD\nthen 7. Done", ctx) == [("number", "7")]
    assert kinds_of("Step 2  ) done", ctx) == [("number", "2")]  # two spaces before ")": no marker


def test_paths_listed_folders_and_what_is_no_path():
    ctx = ("ls /home/ana/reports/ -> q1_summary.csv\nconfig: /opt/app/config.yaml\nsaved to /var/log/app.log.\n"
           "mounted /data/BOX")
    for ok in ["/home/ana/reports/q1_summary.csv", "config.yaml", "/var/log/app.log", "/data/BOX", "/home/ana/reports"]:
        assert check_answer(f"See {ok} now.", ctx) == [], ok
    for bad in ["/home/ana/reports/q9.csv", "README.md", "q2_summary.csv", "/2024/03.csv", "/opt/app.yaml"]:
        assert kinds_of(f"See {bad} now.", ctx) == [("path", bad)], bad
    assert kinds_of("See 2024.csv now.", ctx) == [("number", "2024")]  # a name of digits only is a number
    assert kinds_of("About 3/4 of them.", ctx) == [("number", "3"), ("number", "4")]  # a ratio is no path
    assert check_answer("See https://example.com/home/bob/a.txt now.", ctx) == []  # nothing inside a link
    assert ("path", "/home/bob/x.txt") in kinds_of("At 8 km/h see /home/bob/x.txt now.", ctx)


def test_identifiers_that_are_plain_words_or_units_are_no_claims():
    ctx = "carrier: ups"
    assert check_answer("OK, UPS shipped it.", ctx) == []
    assert kinds_of("OK, order ORD-1 shipped.", ctx) == [("entity", "ORD-1")]
    assert kinds_of("OK, 5 MB and XYZ-9 left.", "5 MB") == [("entity", "XYZ-9")]


def test_one_word_names_inside_a_sentence_and_plain_openers():
    ctx = "customer: maria lopez; carrier: ups"
    table = [
        ("The parcel went to Bristol today.", [("entity", "Bristol")]),
        ("It went to gate X Bristol today.", [("entity", "Bristol")]),
        ("OAuth is down.", [("entity", "OAuth")]),  # a capital inside: a name even as an opener
        ("It shipped. Sadly it broke.", []),
        ("Shipped today\nSadly it broke.", []),
        ("  Sadly it broke.", []),
        ("Sadly, the parcel went to Bristol.", [("entity", "Bristol")]),
        ("After Monday's call it shipped.", []),
        ("Maria Lopez met Bob Smith.", [("entity", "Bob Smith")]),
        ("Maria Lopez's parcel went to Bristol's depot.", [("entity", "Bristol")]),
    ]
    for answer, want in table:
        assert kinds_of(answer, ctx) == want, answer


def test_a_name_span_of_exactly_the_limit_is_checked():
    name80 = "Abcdefghij" + " Abcdefghi" * 7
    assert len(name80) == 80
    assert kinds_of(f"We met {name80} today.", "nothing") == [("entity", name80)]
    assert kinds_of(f"We met {name80}k today.", "nothing") == []  # 81 characters: a title, not one name


def test_claims_written_without_a_space_between_them_are_each_checked():
    ctx = "due 2024-03-05"
    assert kinds_of("Due 5 Mar.Bob Smith pays.", ctx) == [("entity", "Bob Smith")]
    assert kinds_of("I paid Bob Smith$5.", ctx) == [("entity", "Bob Smith"), ("number", "$5")]


def test_a_flag_may_cover_the_whole_text_and_leave_its_text_unset():
    for ok in [Flag(0, 5, "number", "x", "hello"), Flag(0, 1, "entity", "x", "h"), Flag(4, 5, "date", "x", "o"),
               Flag(1, 3, "path", "x", "")]:
        assert validate_flag(ok, "hello") is ok
    for bad in [Flag(2, 2, "number", "x", ""), Flag(3, 2, "number", "x", ""), Flag(-1, 2, "number", "x", ""),
                Flag(0, 6, "number", "x", "")]:
        with pytest.raises(FlagError, match=r"lies outside the 5-character text: a flag must name characters of the "
                                            r"answer it was computed on$"):
            validate_flag(bad, "hello")


# --------------------------------------------------------------------------- synthetic data
def test_gold_spans_are_exactly_the_corrupted_values():
    pairs = make_sessions(60, seed=3)
    by_session: dict[str, list] = {}
    for p in pairs:
        by_session.setdefault(p.session_id, []).append(p)
    assert {p.tool for p in pairs} == {"weather", "stock", "order", "files", "calendar", "account"}
    for group in by_session.values():
        assert len({p.context for p in group}) == 1
        clean = [p for p in group if not p.spans]
        assert len(clean) == 2
        for p in group:
            for s, e, kind in p.spans:
                assert 0 <= s < e <= len(p.answer) and kind in ("number", "unit", "date", "entity", "swap")
                assert p.answer[s:e].strip() == p.answer[s:e] != ""
            if p.spans:
                # Undoing every gold span with some faithful value gives back a sentence the clean answers could be:
                # the text outside the gold spans is untouched (same template pieces as a clean rendering).
                outside = [p.answer[a:b] for a, b in _gaps(p.spans, len(p.answer))]
                assert all(piece in p.answer for piece in outside)
    assert make_sessions(60, seed=3)[7].to_dict() == pairs[7].to_dict()  # deterministic
    assert make_sessions(60, seed=4)[7].to_dict() != pairs[7].to_dict()


def _gaps(spans, n):
    out, pos = [], 0
    for s, e, _ in sorted(spans):
        out.append((pos, s))
        pos = e
    out.append((pos, n))
    return out


def test_the_split_never_shares_a_session_and_is_seeded():
    pairs = make_sessions(200, seed=0)
    train, test = split_by_session(pairs, test_fraction=0.25, seed=0)
    assert not {p.session_id for p in train} & {p.session_id for p in test}
    assert len(train) + len(test) == len(pairs)
    assert 0.15 < len({p.session_id for p in test}) / 200 < 0.35
    again = split_by_session(list(reversed(pairs)), test_fraction=0.25, seed=0)[1]
    assert {p.session_id for p in again} == {p.session_id for p in test}  # order does not matter
    other = split_by_session(pairs, test_fraction=0.25, seed=1)[1]
    assert {p.session_id for p in other} != {p.session_id for p in test}
    with pytest.raises(ValueError, match="test_fraction"):
        split_by_session(pairs, test_fraction=1.0)


# --------------------------------------------------------------------------- tagger spans and the combination
def test_tagger_tokens_become_word_spans_and_rules_win_overlaps():
    answer = "Paid $1,205.50 to Trader Joe's today."
    toks = [(0, 4, 0.1), (5, 6, 0.9), (6, 7, 0.8), (7, 8, 0.9), (8, 11, 0.9), (11, 12, 0.7), (12, 14, 0.6),
            (15, 17, 0.2), (18, 24, 0.9), (25, 28, 0.8), (28, 30, 0.6), (31, 36, 0.1)]
    spans = spans_from_tokens(answer, toks, 0.5)
    assert [s.text for s in spans] == ["$1,205.50", "Trader Joe's"]
    rules = [Flag(5, 14, "number", "r", "$1,205.50")]
    both = combine(rules, spans)
    assert [(f.text, f.detector) for f in both] == [("$1,205.50", "rules"), ("Trader Joe's", "tagger")]


def test_tagger_loss_weighs_unsupported_tokens_by_hand():
    import math

    import torch

    logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
    labels = torch.tensor([[0, 1, 1, -100]])  # the last token is context: ignored
    nll = [math.log(2), math.log(1 + math.e ** 2), math.log(1 + math.e ** -1)]  # -log softmax at each label
    w = 4.0
    by_hand = (nll[0] + w * nll[1] + w * nll[2]) / (1 + w + w)
    assert tagger_loss(logits, labels, w).item() == pytest.approx(by_hand, rel=1e-6)
    assert tagger_loss(logits, labels, 1.0).item() == pytest.approx(sum(nll) / 3, rel=1e-6)
    assert positive_weight([torch.tensor([[-100, 0, 0, 1, 0]]), torch.tensor([[0, 0, 1, 0, 0, -100]])]) == 7 / 2
    assert positive_weight([torch.tensor([[0, 0, -100]])]) == 1.0  # no unsupported token: unweighted


def test_choose_threshold_maximises_exact_span_f1_on_held_out_pairs():
    a = Pair("s1", "t", "ctx", "Paid 12 to Bo.", [(5, 7, "number")])
    b = Pair("s2", "t", "ctx", "All good here.", [])
    probs = [[(0, 4, 0.3), (5, 7, 0.7), (8, 10, 0.1), (11, 13, 0.45)], [(0, 3, 0.2), (4, 8, 0.35), (9, 13, 0.1)]]
    # by hand: t in (0.45, 0.7] flags exactly "12" (F1 1); t in (0.35, 0.45] adds "Bo" (P 1/2, F1 2/3); t > 0.7 none
    t, f1 = choose_threshold([a, b], probs)
    assert f1 == pytest.approx(1.0) and t == 0.7  # ties go to the highest threshold
    assert span_counts([a, b], [[Flag(5, 7, "number", "", "12"), Flag(11, 13, "entity", "", "Bo")], []]) == (1, 1, 0)
    assert span_counts([a], [[Flag(5, 8, "number", "", "12 ")]]) == (0, 1, 1)  # exact boundaries only
    t, f1 = choose_threshold([a, b], probs, grid=(0.4,))
    assert (t, f1) == (0.4, pytest.approx(2 / 3))


# --------------------------------------------------------------------------- the policy in training
def flag(ts, te, us, ue):
    return {"token_start": ts, "token_end": te, "turn_token_start": us, "turn_token_end": ue}


def test_penalize_sets_exactly_the_flagged_tokens_to_minus_the_penalty():
    sample = TrainSample([1, 2], list(range(10)), 0.5, token_advantages=[0.1 * i for i in range(10)],
                         loss_mask=[0, 1, 1, 1, 1, 0, 1, 1, 1, 1])
    out, counts = apply_flags(sample, [flag(2, 4, 1, 5), flag(7, 8, 6, 10), flag(3, 5, 1, 5)], "penalize", 0.75)
    # Hand computation: tokens 2, 3, 4 (two overlapping flags) and 7 get -0.75; the rest keep 0.1 * i.
    expected = [0.0, 0.1, -0.75, -0.75, -0.75, 0.5, 0.6, -0.75, 0.8, 0.9]
    assert out.token_advantages == pytest.approx(expected)
    assert out.loss_mask == sample.loss_mask
    assert counts == {"penalized_tokens": 4, "blocked_turns": 0}
    assert sample.token_advantages == pytest.approx([0.1 * i for i in range(10)])  # the input is unchanged


def test_penalize_broadcasts_a_sequence_advantage_first():
    sample = TrainSample([1], [5, 6, 7, 8], 2.0)
    out, _ = apply_flags(sample, [flag(1, 2, 0, 4)], "penalize", 1.5)
    assert out.token_advantages == [2.0, -1.5, 2.0, 2.0]


def test_block_masks_exactly_the_flagged_turn():
    sample = TrainSample([1], list(range(12)), 1.0, token_advantages=[1.0] * 12,
                         loss_mask=[0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1])
    out, counts = apply_flags(sample, [flag(7, 8, 6, 9), flag(6, 7, 6, 9)], "block", 1.0)
    assert out.loss_mask == [0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
    assert out.token_advantages == sample.token_advantages
    assert counts == {"penalized_tokens": 0, "blocked_turns": 1}
    single, counts = apply_flags(TrainSample([1], [4, 5, 6], 1.0), [flag(1, 2, 0, 3)], "block", 1.0)
    assert single.loss_mask == [0, 0, 0] and counts["blocked_turns"] == 1


def test_off_and_no_flags_change_nothing():
    sample = TrainSample([1], [4, 5, 6], 1.0)
    assert apply_flags(sample, [flag(0, 1, 0, 3)], "off", 1.0)[0] is sample
    assert apply_flags(sample, [], "penalize", 1.0)[0] is sample


def test_a_flag_outside_its_sample_is_refused_clearly():
    sample = TrainSample([1], [4, 5, 6], 1.0)
    with pytest.raises(GroundingFlagError, match="rollout r9 names tokens \\[2, 5\\) in turn \\[0, 5\\), outside its 3-token completion"):
        apply_flags(sample, [flag(2, 5, 0, 5)], "penalize", 1.0, rollout_id="r9")
    with pytest.raises(GroundingFlagError, match="outside"):
        apply_flags(sample, [flag(0, 2, 1, 3)], "block", 1.0)
    with pytest.raises(ValueError, match="grounding_policy must be one of"):
        apply_flags(sample, [flag(0, 1, 0, 3)], "warn", 1.0)


def test_chars_to_tokens():
    offsets = [0, 3, 4, 9, 10, 14]  # tokens: [0,3) [3,4) [4,9) [9,10) [10,14)
    assert chars_to_tokens(offsets, 4, 9) == (2, 3)
    assert chars_to_tokens(offsets, 5, 11) == (2, 5)
    assert chars_to_tokens(offsets, 0, 1) == (0, 1)
    with pytest.raises(GroundingFlagError, match="outside the 14-character"):
        chars_to_tokens(offsets, 10, 15)
