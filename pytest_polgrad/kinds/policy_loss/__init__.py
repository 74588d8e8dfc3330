"""The policy-loss kind: its checks, oracle, report, snippet, golden and diagnosis."""
