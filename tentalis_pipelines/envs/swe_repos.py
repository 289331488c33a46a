"""The mini-SWE family's repositories: small pure-Python modules, each with its own test file.

Each repository is one module (``roman.py``), its test file (``test_roman.py``: plain functions named
``test_*`` that ``assert``; no pytest needed) and the shared runner :data:`RUNNER` (``run_tests.py``),
which the agent runs with ``python3 run_tests.py`` in the sandbox and the verifier runs on a pristine
copy of the tests. The mutation engine (``swe_tasks.py``) injects one bug at a time into a module; the
tests decide which bugs count.

The sources are plain ASCII (the engine edits them by the AST's column offsets, which count bytes) and
every test passes on the pristine module (a unit test and the catalogue builder check both). Levels by
size: 1, a module under 35 lines; 2, under 70; 3, larger (more code to read before the fix).
"""

from __future__ import annotations

# The test runner shipped in every task's tree. Test functions are found by parsing the test files (so a
# test module that fails to import still reports its tests, failed); each test runs under a repeating
# alarm (a mutated loop that never ends fails that test instead of the run; past a total budget the rest
# fail unrun); output is line-buffered (a run killed at the time limit still shows what it did); bytecode is never written
# (a same-size edit within one second would otherwise run stale ``.pyc``). With ``SWE_REPORT`` set, the
# last line is that marker followed by a JSON object ``{test id: "PASSED" | "FAILED"}`` (the verifier's).
RUNNER = '''"""Run the tests: python3 run_tests.py [test_file.py::test_name ...]"""
import sys

sys.dont_write_bytecode = True
import ast
import importlib
import json
import os
import signal
import time
import traceback

LIMIT_S = 1.0
BUDGET_S = 15.0


def _alarm(signum, frame):
    raise TimeoutError(f"the test ran past {LIMIT_S:g} s")


def _where(exc, test_file):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.basename(f.filename) != "run_tests.py"]
    lines = []
    mine = [f for f in frames if os.path.basename(f.filename) == test_file]
    if mine:
        f = mine[-1]
        lines.append(f"{test_file}:{f.lineno}: {f.line}")
    if frames and os.path.basename(frames[-1].filename) != test_file:
        f = frames[-1]
        lines.append(f"raised in {os.path.basename(f.filename)}:{f.lineno} in {f.name}: {f.line}")
    message = str(exc)
    lines.append(type(exc).__name__ + (f": {message[:300]}" if message else ""))
    return lines


def main(selected):
    sys.stdout.reconfigure(line_buffering=True)
    sys.path.insert(0, os.getcwd())
    start = time.monotonic()
    signal.signal(signal.SIGALRM, _alarm)
    results = {}
    for test_file in sorted(n for n in os.listdir(".") if n.startswith("test_") and n.endswith(".py")):
        with open(test_file, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        try:
            module, import_error = importlib.import_module(test_file[:-3]), None
        except BaseException as exc:
            module, import_error = None, exc
        for name in names:
            test_id = f"{test_file}::{name}"
            if selected and test_id not in selected:
                continue
            if import_error is not None:
                results[test_id] = "FAILED"
                print(f"{test_id} FAILED")
                print("    " + "\\n    ".join(_where(import_error, test_file)))
                continue
            if time.monotonic() - start > BUDGET_S:
                results[test_id] = "FAILED"
                print(f"{test_id} FAILED")
                print(f"    not run: the tests used up their {BUDGET_S:g} s")
                continue
            signal.setitimer(signal.ITIMER_REAL, LIMIT_S, 0.1)
            try:
                getattr(module, name)()
                outcome = None
            except BaseException as exc:
                outcome = exc
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            results[test_id] = "PASSED" if outcome is None else "FAILED"
            print(f"{test_id} {results[test_id]}")
            if outcome is not None:
                print("    " + "\\n    ".join(_where(outcome, test_file)))
    failed = sum(v == "FAILED" for v in results.values())
    print(f"==== {failed} failed, {len(results) - failed} passed ====")
    marker = os.environ.get("SWE_REPORT")
    if marker:
        print(marker + json.dumps(results, sort_keys=True))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(set(sys.argv[1:])))
'''

# --------------------------------------------------------------------------- level 1
STACK = '''"""A bounded stack."""


class StackError(Exception):
    pass


class Stack:
    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.items = []

    def push(self, item):
        if len(self.items) >= self.capacity:
            raise StackError("stack is full")
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise StackError("stack is empty")
        return self.items.pop()

    def peek(self):
        if len(self.items) == 0:
            raise StackError("stack is empty")
        return self.items[-1]

    def size(self):
        return len(self.items)

    def is_full(self):
        return len(self.items) == self.capacity
'''

TEST_STACK = '''from stack import Stack, StackError


def test_push_pop_order():
    s = Stack(3)
    s.push(1)
    s.push(2)
    s.push(3)
    assert [s.pop(), s.pop(), s.pop()] == [3, 2, 1]


def test_peek_does_not_remove():
    s = Stack(2)
    s.push("a")
    assert s.peek() == "a"
    assert s.size() == 1


def test_full_stack_refuses_push():
    s = Stack(2)
    s.push(1)
    s.push(2)
    assert s.is_full()
    try:
        s.push(3)
    except StackError:
        return
    raise AssertionError("push on a full stack must raise StackError")


def test_not_full_below_capacity():
    s = Stack(3)
    s.push(1)
    s.push(2)
    assert not s.is_full()
    s.push(3)
    assert s.size() == 3


def test_empty_pop_and_peek_raise():
    s = Stack(1)
    for op in (s.pop, s.peek):
        try:
            op()
        except StackError:
            continue
        raise AssertionError("pop/peek on an empty stack must raise StackError")


def test_capacity_one_is_valid_zero_is_not():
    assert Stack(1).capacity == 1
    try:
        Stack(0)
    except ValueError:
        return
    raise AssertionError("Stack(0) must raise ValueError")
'''

ROMAN = '''"""Roman numerals from 1 to 3999."""

VALUES = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(n):
    if n < 1 or n > 3999:
        raise ValueError("out of range")
    out = ""
    for value, letters in VALUES:
        while n >= value:
            out += letters
            n -= value
    return out


def from_roman(text):
    singles = {letters: value for value, letters in VALUES if len(letters) == 1}
    total = 0
    for i, ch in enumerate(text):
        value = singles[ch]
        if i + 1 < len(text) and singles[text[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
'''

TEST_ROMAN = '''from roman import from_roman, to_roman


def test_small_numbers():
    assert [to_roman(n) for n in (1, 2, 3, 5, 10)] == ["I", "II", "III", "V", "X"]


def test_subtractive_forms():
    assert to_roman(4) == "IV"
    assert to_roman(9) == "IX"
    assert to_roman(40) == "XL"
    assert to_roman(900) == "CM"


def test_larger_numbers():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"
    assert to_roman(2024) == "MMXXIV"


def test_range_is_checked():
    for bad in (0, 4000):
        try:
            to_roman(bad)
        except ValueError:
            continue
        raise AssertionError(f"to_roman({bad}) must raise ValueError")


def test_parse():
    assert from_roman("XIV") == 14
    assert from_roman("MCMXCIV") == 1994
    assert from_roman("III") == 3


def test_round_trip():
    for n in (1, 4, 49, 444, 999, 3888):
        assert from_roman(to_roman(n)) == n
'''

WORDCOUNT = '''"""Word frequencies of a text."""


def words(text):
    out = []
    for raw in text.lower().split():
        word = raw.strip(".,;:!?\\"'()")
        if len(word) > 0:
            out.append(word)
    return out


def counts(text):
    table = {}
    for word in words(text):
        table[word] = table.get(word, 0) + 1
    return table


def top(text, n):
    table = counts(text)
    ranked = sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked[:n]
'''

TEST_WORDCOUNT = '''from wordcount import counts, top, words


def test_words_are_lowercased_and_stripped():
    assert words("Hello, world! Hello.") == ["hello", "world", "hello"]


def test_punctuation_only_tokens_are_dropped():
    assert words("a -- ... b") == ["a", "--", "b"]
    assert words("... !!") == []


def test_counts():
    assert counts("the cat and the hat") == {"the": 2, "cat": 1, "and": 1, "hat": 1}


def test_top_orders_by_count_then_word():
    assert top("b a b c a b", 2) == [("b", 3), ("a", 2)]
    assert top("z y x", 2) == [("x", 1), ("y", 1)]


def test_top_n_larger_than_vocabulary():
    assert top("one two", 5) == [("one", 1), ("two", 1)]
'''

# --------------------------------------------------------------------------- level 2
INTERVALS = '''"""Closed integer intervals [start, end]."""


def normalize(interval):
    start, end = interval
    if start > end:
        start, end = end, start
    return (start, end)


def overlaps(a, b):
    a, b = normalize(a), normalize(b)
    return a[0] <= b[1] and b[0] <= a[1]


def merge(intervals):
    ordered = sorted(normalize(i) for i in intervals)
    merged = []
    for start, end in ordered:
        if merged and start <= merged[-1][1] + 1:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


def covered(intervals):
    total = 0
    for start, end in merge(intervals):
        total += end - start + 1
    return total


def gaps(intervals, low, high):
    out = []
    cursor = low
    for start, end in merge(intervals):
        if end < low or start > high:
            continue
        if start > cursor:
            out.append((cursor, start - 1))
        cursor = max(cursor, end + 1)
    if cursor <= high:
        out.append((cursor, high))
    return out
'''

TEST_INTERVALS = '''from intervals import covered, gaps, merge, normalize, overlaps


def test_normalize_swaps_reversed():
    assert normalize((5, 2)) == (2, 5)
    assert normalize((2, 5)) == (2, 5)


def test_overlaps():
    assert overlaps((1, 3), (3, 6))
    assert not overlaps((1, 2), (4, 5))
    assert overlaps((6, 3), (4, 4))


def test_merge_joins_overlapping_and_adjacent():
    assert merge([(1, 3), (2, 6), (8, 10), (11, 12)]) == [(1, 6), (8, 12)]


def test_merge_keeps_separate():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_merge_contained():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]


def test_covered_counts_points():
    assert covered([(1, 3), (2, 4)]) == 4
    assert covered([(0, 0), (10, 12)]) == 4


def test_gaps():
    assert gaps([(2, 3), (6, 7)], 0, 9) == [(0, 1), (4, 5), (8, 9)]
    assert gaps([(0, 9)], 0, 9) == []
    assert gaps([], 3, 4) == [(3, 4)]
'''

MATRIX = '''"""Matrices as lists of rows."""


def shape(m):
    return (len(m), len(m[0]) if m else 0)


def identity(n):
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def transpose(m):
    rows, cols = shape(m)
    return [[m[i][j] for i in range(rows)] for j in range(cols)]


def add(a, b):
    if shape(a) != shape(b):
        raise ValueError("shapes differ")
    return [[x + y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]


def multiply(a, b):
    rows, inner = shape(a)
    inner_b, cols = shape(b)
    if inner != inner_b:
        raise ValueError("inner dimensions differ")
    out = []
    for i in range(rows):
        row = []
        for j in range(cols):
            total = 0
            for k in range(inner):
                total += a[i][k] * b[k][j]
            row.append(total)
        out.append(row)
    return out


def trace(m):
    rows, cols = shape(m)
    if rows != cols:
        raise ValueError("not square")
    return sum(m[i][i] for i in range(rows))


def power(m, k):
    result = identity(len(m))
    for _ in range(k):
        result = multiply(result, m)
    return result
'''

TEST_MATRIX = '''from matrix import add, identity, multiply, power, shape, trace, transpose


def test_shape():
    assert shape([[1, 2, 3], [4, 5, 6]]) == (2, 3)
    assert shape([]) == (0, 0)


def test_identity():
    assert identity(2) == [[1, 0], [0, 1]]


def test_transpose():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_add_and_shape_check():
    assert add([[1, 2]], [[10, 20]]) == [[11, 22]]
    try:
        add([[1]], [[1, 2]])
    except ValueError:
        return
    raise AssertionError("adding different shapes must raise ValueError")


def test_multiply():
    assert multiply([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]
    assert multiply([[1, 2, 3]], [[1], [2], [3]]) == [[14]]


def test_multiply_checks_dimensions():
    try:
        multiply([[1, 2]], [[1, 2]])
    except ValueError:
        return
    raise AssertionError("multiplying 1x2 by 1x2 must raise ValueError")


def test_trace():
    assert trace([[1, 2], [3, 4]]) == 5
    try:
        trace([[1, 2]])
    except ValueError:
        return
    raise AssertionError("trace of a non-square matrix must raise ValueError")


def test_power():
    assert power([[1, 1], [1, 0]], 5) == [[8, 5], [5, 3]]
    assert power([[2, 0], [0, 2]], 0) == [[1, 0], [0, 1]]
'''

BANK = '''"""Accounts with overdraft limits and transfers."""


class InsufficientFunds(Exception):
    pass


class Account:
    def __init__(self, owner, balance=0, overdraft=0):
        self.owner = owner
        self.balance = balance
        self.overdraft = overdraft
        self.history = []

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def available(self):
        return self.balance + self.overdraft

    def withdraw(self, amount):
        if amount <= 0:
            raise ValueError("withdrawal must be positive")
        if amount > self.available():
            raise InsufficientFunds(self.owner)
        self.balance -= amount
        self.history.append(("withdraw", amount))


def transfer(source, target, amount):
    source.withdraw(amount)
    target.deposit(amount)
    return source.balance, target.balance


def total_deposits(account):
    return sum(amount for kind, amount in account.history if kind == "deposit")


def richest(accounts):
    best = None
    for account in accounts:
        if best is None or account.balance > best.balance:
            best = account
    return best.owner if best is not None else None
'''

TEST_BANK = '''from bank import Account, InsufficientFunds, richest, total_deposits, transfer


def test_deposit_and_withdraw():
    a = Account("ann", 100)
    a.deposit(50)
    a.withdraw(30)
    assert a.balance == 120


def test_invalid_amounts():
    a = Account("ann", 10)
    for op in (a.deposit, a.withdraw):
        try:
            op(0)
        except ValueError:
            continue
        raise AssertionError("a zero amount must raise ValueError")


def test_overdraft_limit():
    a = Account("bob", 10, overdraft=20)
    a.withdraw(30)
    assert a.balance == -20
    try:
        a.withdraw(1)
    except InsufficientFunds:
        return
    raise AssertionError("withdrawing past the overdraft must raise InsufficientFunds")


def test_transfer():
    a, b = Account("a", 50), Account("b", 5)
    assert transfer(a, b, 20) == (30, 25)


def test_failed_transfer_changes_nothing():
    a, b = Account("a", 5), Account("b", 5)
    try:
        transfer(a, b, 6)
    except InsufficientFunds:
        pass
    assert (a.balance, b.balance) == (5, 5)


def test_total_deposits():
    a = Account("c")
    a.deposit(5)
    a.deposit(7)
    a.withdraw(2)
    assert total_deposits(a) == 12


def test_richest():
    assert richest([Account("x", 1), Account("y", 9), Account("z", 4)]) == "y"
    assert richest([]) is None
'''

# --------------------------------------------------------------------------- level 3
CALENDAR_UTIL = '''"""Calendar arithmetic without the datetime module (proleptic Gregorian calendar)."""

MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def is_leap(year):
    if year % 400 == 0:
        return True
    if year % 100 == 0:
        return False
    return year % 4 == 0


def days_in_month(year, month):
    if month < 1 or month > 12:
        raise ValueError("month must be 1 to 12")
    if month == 2 and is_leap(year):
        return 29
    return MONTH_DAYS[month - 1]


def check(year, month, day):
    if day < 1 or day > days_in_month(year, month):
        raise ValueError("no such day")


def day_of_year(year, month, day):
    check(year, month, day)
    total = day
    for m in range(1, month):
        total += days_in_month(year, m)
    return total


def days_in_year(year):
    return 366 if is_leap(year) else 365


def ordinal(year, month, day):
    days = 0
    for y in range(1, year):
        days += days_in_year(y)
    return days + day_of_year(year, month, day)


def weekday(year, month, day):
    return WEEKDAYS[(ordinal(year, month, day) - 1) % 7]


def days_between(a, b):
    return ordinal(*b) - ordinal(*a)


def add_days(year, month, day, n):
    check(year, month, day)
    while n > 0:
        if day < days_in_month(year, month):
            day += 1
        elif month < 12:
            month, day = month + 1, 1
        else:
            year, month, day = year + 1, 1, 1
        n -= 1
    return (year, month, day)


def month_grid(year, month):
    first = WEEKDAYS.index(weekday(year, month, 1))
    cells = [0] * first + list(range(1, days_in_month(year, month) + 1))
    while len(cells) % 7 != 0:
        cells.append(0)
    return [cells[i:i + 7] for i in range(0, len(cells), 7)]
'''

TEST_CALENDAR_UTIL = '''from calendar_util import (add_days, day_of_year, days_between, days_in_month, is_leap, month_grid,
                           weekday)


def test_leap_years():
    assert is_leap(2024) and is_leap(2000)
    assert not is_leap(1900) and not is_leap(2023)


def test_days_in_month():
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2024, 12) == 31
    assert days_in_month(2024, 4) == 30


def test_bad_month_and_day():
    for args in ((2024, 13, 1), (2024, 0, 1), (2023, 2, 29), (2024, 1, 0)):
        try:
            day_of_year(*args)
        except ValueError:
            continue
        raise AssertionError(f"day_of_year{args} must raise ValueError")


def test_day_of_year():
    assert day_of_year(2023, 1, 1) == 1
    assert day_of_year(2023, 3, 1) == 60
    assert day_of_year(2024, 3, 1) == 61
    assert day_of_year(2024, 12, 31) == 366


def test_weekday():
    assert weekday(1, 1, 1) == "Monday"
    assert weekday(2024, 1, 1) == "Monday"
    assert weekday(2000, 2, 29) == "Tuesday"
    assert weekday(1969, 7, 20) == "Sunday"


def test_days_between():
    assert days_between((2024, 1, 1), (2024, 3, 1)) == 60
    assert days_between((2023, 12, 31), (2024, 1, 1)) == 1


def test_add_days():
    assert add_days(2024, 2, 28, 1) == (2024, 2, 29)
    assert add_days(2023, 12, 30, 3) == (2024, 1, 2)
    assert add_days(2024, 5, 5, 0) == (2024, 5, 5)


def test_month_grid():
    grid = month_grid(2024, 9)
    assert grid[0] == [0, 0, 0, 0, 0, 0, 1]
    assert grid[-1] == [30, 0, 0, 0, 0, 0, 0]
    assert len(grid) == 6
'''

RPN = '''"""Arithmetic expressions: tokenize, convert to reverse Polish notation, evaluate."""

PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "^": 3}
RIGHT_ASSOCIATIVE = {"^"}


def tokenize(text):
    tokens = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit():
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            tokens.append(int(text[i:j]))
            i = j
        elif ch in PRECEDENCE or ch in "()":
            tokens.append(ch)
            i += 1
        else:
            raise ValueError(f"unexpected character {ch!r}")
    return tokens


def to_rpn(tokens):
    output = []
    stack = []
    for token in tokens:
        if isinstance(token, int):
            output.append(token)
        elif token == "(":
            stack.append(token)
        elif token == ")":
            while stack and stack[-1] != "(":
                output.append(stack.pop())
            if not stack:
                raise ValueError("unbalanced parentheses")
            stack.pop()
        else:
            while stack and stack[-1] != "(":
                top = stack[-1]
                if PRECEDENCE[top] > PRECEDENCE[token] or (
                        PRECEDENCE[top] == PRECEDENCE[token] and token not in RIGHT_ASSOCIATIVE):
                    output.append(stack.pop())
                else:
                    break
            stack.append(token)
    while stack:
        token = stack.pop()
        if token == "(":
            raise ValueError("unbalanced parentheses")
        output.append(token)
    return output


def apply(op, left, right):
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if op == "/":
        if right == 0:
            raise ZeroDivisionError("division by zero")
        return left // right
    return left ** right


def evaluate_rpn(items):
    stack = []
    for item in items:
        if isinstance(item, int):
            stack.append(item)
        else:
            if len(stack) < 2:
                raise ValueError("missing operand")
            right = stack.pop()
            left = stack.pop()
            stack.append(apply(item, left, right))
    if len(stack) != 1:
        raise ValueError("malformed expression")
    return stack[0]


def calculate(text):
    return evaluate_rpn(to_rpn(tokenize(text)))
'''

TEST_RPN = '''from rpn import apply, calculate, evaluate_rpn, to_rpn, tokenize


def test_tokenize():
    assert tokenize("12 + 3*(4-1)") == [12, "+", 3, "*", "(", 4, "-", 1, ")"]


def test_tokenize_rejects_letters():
    try:
        tokenize("2 + x")
    except ValueError:
        return
    raise AssertionError("a letter must raise ValueError")


def test_to_rpn_precedence():
    assert to_rpn(tokenize("1 + 2 * 3")) == [1, 2, 3, "*", "+"]
    assert to_rpn(tokenize("(1 + 2) * 3")) == [1, 2, "+", 3, "*"]


def test_left_and_right_associativity():
    assert calculate("10 - 4 - 3") == 3
    assert calculate("2 ^ 3 ^ 2") == 512
    assert calculate("100 / 10 / 5") == 2


def test_apply():
    assert [apply(op, 7, 2) for op in "+-*/^"] == [9, 5, 14, 3, 49]


def test_calculate():
    assert calculate("2 * (3 + 4) - 5") == 9
    assert calculate("7") == 7


def test_evaluate_errors():
    for items in ([1, "+"], [1, 2]):
        try:
            evaluate_rpn(items)
        except ValueError:
            continue
        raise AssertionError(f"evaluate_rpn({items}) must raise ValueError")


def test_unbalanced_and_zero_division():
    for text, error in (("(1 + 2", ValueError), ("1 + 2)", ValueError), ("4 / (2 - 2)", ZeroDivisionError)):
        try:
            calculate(text)
        except error:
            continue
        raise AssertionError(f"calculate({text!r}) must raise {error.__name__}")
'''

# module name -> (level, module source, test source)
REPOS: dict[str, tuple[int, str, str]] = {
    "stack": (1, STACK, TEST_STACK),
    "roman": (1, ROMAN, TEST_ROMAN),
    "wordcount": (1, WORDCOUNT, TEST_WORDCOUNT),
    "intervals": (2, INTERVALS, TEST_INTERVALS),
    "matrix": (2, MATRIX, TEST_MATRIX),
    "bank": (2, BANK, TEST_BANK),
    "calendar_util": (3, CALENDAR_UTIL, TEST_CALENDAR_UTIL),
    "rpn": (3, RPN, TEST_RPN),
}


def repo_tree(module: str, source: str | None = None) -> dict[str, str]:
    """The tree of ``module``'s repository (its source replaced by ``source`` when given): the module,
    its test file and the runner."""
    if module not in REPOS:
        raise ValueError(f"no mini-SWE repository {module!r}; known: {', '.join(REPOS)}")
    _, pristine, tests = REPOS[module]
    return {f"{module}.py": pristine if source is None else source, f"test_{module}.py": tests, "run_tests.py": RUNNER}
