"""Answer verifiers, step parsing and checks, manager reviews, reward combination, advantages."""
