"""A miniature RL trainer's loss module, written the way trainers write them, bugs and all.

Used by ``examples/test_minitrainer_conformance.py`` (run with ``make demo``) to show what
pytest-polgrad finds. The functions marked *wrong* below contain realistic mistakes on
purpose; nothing here is copied from a real framework.
"""
