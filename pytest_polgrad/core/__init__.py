"""The kind-independent machinery: options, tolerance, engine, verdicts, goldens' format."""
