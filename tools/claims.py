"""Every documented claim and the test node that enforces it: the one source of the claim
tables in README.md and docs/index.md (rendered by ``tools/generate_docs.py``).

``tests/docs/test_claims.py`` checks that every claimed test exists and the tables are current;
``tests/conftest.py`` fails a whole-suite run in which a claimed test did not pass.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Claim:
    """``text`` is enforced by every test node whose id is ``test`` (or ``test[...]``)."""

    text: str
    page: str
    """The docs page (under docs/) that states and derives it."""
    test: str
    """``tests/file.py::function`` (all parametrizations) or a full node id."""
    seed: bool = False
    """One of the identities of the project's founding description (SEED.md)."""


CLAIMS: tuple[Claim, ...] = (
    # ------------------------------------------------------------- the seed's identities
    Claim(
        "aggregate(x, m, mode) equals sum_t w_t x_t with closed-form weights, bitwise, "
        "including autograd",
        "aggregation.md",
        "tests/reference/test_aggregate.py::test_gradient_is_the_weights_bitwise",
        seed=True,
    ),
    Claim(
        "micro-batch aggregation weights equal autograd of an explicit accumulation loop",
        "aggregation.md",
        "tests/reference/test_aggregate.py::test_microbatch_weights_equal_autograd_of_an_accumulation_loop",
        seed=True,
    ),
    Claim(
        "E[k1] = E[k3] = KL(pi || ref) exactly on a categorical",
        "kl.md",
        "tests/reference/test_kl.py::test_k1_and_k3_expectations_equal_kl_exactly",
        seed=True,
    ),
    Claim(
        "k2's bias is third order in the log-ratio, with the predicted coefficient",
        "kl.md",
        "tests/reference/test_kl.py::test_k2_bias_is_third_order_with_the_predicted_coefficient",
        seed=True,
    ),
    Claim(
        "the k2-as-loss gradient equals the reverse-KL score-function surrogate's, bitwise, "
        "for every aggregation",
        "kl.md",
        "tests/reference/test_kl.py::test_k2_loss_gradient_equals_surrogate_gradient_bitwise",
        seed=True,
    ),
    Claim(
        "the k3-as-loss gradient is not grad KL: Monte Carlo, > 10 CLT tolerances away "
        "(k1 likewise; k2 and the '+' estimators give it)",
        "derivations/kl.md",
        "tests/reference/test_verify.py::test_k1_and_k3_gradients_as_a_loss_are_not_the_kl_gradient",
        seed=True,
    ),
    Claim(
        "k2 (and k1+/k3+/abs+, which carry k2's gradient) as a loss gives grad KL within "
        "CLT tolerances on the softmax bandit",
        "derivations/kl.md",
        "tests/reference/test_verify.py::test_k2_gradient_as_a_loss_is_the_kl_gradient",
    ),
    Claim(
        "PG_CLIP, PG, REINFORCE and CISPO gradients coincide on-policy, bitwise",
        "losses.md",
        "tests/reference/test_losses.py::test_on_policy_pg_clip_pg_reinforce_cispo_gradients_coincide_bitwise",
        seed=True,
    ),
    Claim(
        "GSPO-token's value equals GSPO-sequence's",
        "losses.md",
        "tests/reference/test_losses.py::test_gspo_token_value_equals_gspo_and_gradients_agree_for_sequence_advantages",
        seed=True,
    ),
    Claim(
        "GSPO-token's gradient is token-local",
        "losses.md",
        "tests/reference/test_losses.py::test_gspo_token_gradient_is_token_local",
        seed=True,
    ),
    Claim(
        "the clip zero-gradient region equals the autograd-zero tokens, including dual clip",
        "losses.md",
        "tests/reference/test_losses.py::test_clip_region_equals_autograd_zero_tokens",
        seed=True,
    ),
    Claim(
        "RLOO's leave-one-out advantage equals (G/(G-1)) (r - mean)",
        "advantages.md",
        "tests/reference/test_advantages.py::test_rloo_equals_scaled_centred_reward",
        seed=True,
    ),
    Claim(
        "importance ESS/n is exactly 1 on-policy",
        "diagnostics.md",
        "tests/reference/diagnostics/test_ess.py::test_on_policy_ess_is_exactly_one",
        seed=True,
    ),
    Claim(
        "token ESS/n tends to exp(-sigma^2) under N(0, sigma^2) log-weight drift",
        "diagnostics.md",
        "tests/reference/diagnostics/test_ess.py::test_token_ess_converges_to_exp_minus_sigma_squared",
        seed=True,
    ),
    Claim(
        "the entropy changepoint test has an exact permutation level <= alpha",
        "diagnostics.md",
        "tests/reference/diagnostics/test_trend.py::test_level_is_exact_under_exchangeability",
        seed=True,
    ),
    Claim(
        "every registry algorithm optimises the softmax bandit to convergence",
        "derivations/index.md",
        "tests/reference/test_verify.py::test_every_registry_algorithm_optimises_the_bandit",
        seed=True,
    ),
    # --------------------------------------------------------------------- reference
    Claim(
        "fp64 gradcheck of every registry algorithm, stop-gradients frozen at the base "
        "point, over batches that reach every clip region",
        "derivations/index.md",
        "tests/reference/test_verify.py::test_gradcheck_every_registry_algorithm_on_ragged_batches",
    ),
    Claim(
        "the gradcheck catches a wrong backward",
        "derivations/index.md",
        "tests/reference/test_verify.py::test_gradcheck_catches_a_wrong_backward",
    ),
    Claim(
        "gradcheck and the formula check hold a stop-gradient however it is written "
        "(detach, torch.detach, .data, detach_, no_grad, set_grad_enabled) on a user's own loss",
        "derivations/own-loss.md",
        "tests/reference/test_verify_own_loss.py::test_every_stop_gradient_spelling_passes_the_formula_check",
    ),
    Claim(
        "the formula check compares only where where= selects: NaN padding does not fail it",
        "derivations/own-loss.md",
        "tests/reference/test_verify_own_loss.py::test_nan_padding_is_masked_by_where",
    ),
    Claim(
        "a missing stop-gradient is named as such, with the operation and line that lack it",
        "derivations/own-loss.md",
        "tests/reference/test_verify_own_loss.py::test_a_missing_stop_gradient_is_named_as_such",
    ),
    Claim(
        "the finite-difference formula check fails a wrong derivation and wrong code",
        "derivations/index.md",
        "tests/reference/test_verify.py::test_formula_check_fails_a_wrong_derivation",
    ),
    Claim(
        "the hand-derived golden cases hold to 1e-14",
        "derivations/goldens.md",
        "tests/reference/test_verify.py::test_hand_derived_golden",
    ),
    Claim(
        "the demo reproduces the seed's table (losses to 8 decimals, gradient masses to 5)",
        "index.md",
        "tests/docs/test_example.py::test_table_numbers_match_the_seed",
    ),
    Claim(
        "the clip report's killed set equals autograd's zero set",
        "diagnostics.md",
        "tests/reference/diagnostics/test_clip.py::test_killed_set_equals_autograd_zero_set",
    ),
    Claim(
        "the run monitor's false-alarm rate over 10,000 null steps is within its bound",
        "diagnostics.md",
        "tests/reference/diagnostics/test_monitor.py::test_false_alarm_rate_over_10000_null_steps_is_within_the_bound",
    ),
    Claim(
        "the run monitor keeps its whole-run bound on the library's own null z's (covariance "
        "at B = 8, length bias at the example's shape); the old normal-approximation z's break it",
        "diagnostics.md",
        "tests/reference/diagnostics/test_monitor.py::test_the_librarys_own_null_z_scores_keep_the_whole_run_bound",
    ),
    Claim(
        "the mismatch test keeps its level when a row's tokens share their error",
        "diagnostics.md",
        "tests/reference/diagnostics/test_mismatch.py::test_noise_floor_null_false_alarm_rate_is_within_alpha",
    ),
    Claim(
        "the covariance test's level holds and its z is N(0, 1) at B = 5 and 8",
        "diagnostics.md",
        "tests/reference/diagnostics/test_covariance.py::test_z_is_standard_normal_and_the_level_holds_at_small_batches",
    ),
    Claim(
        "the length-bias test's level holds at B = 16 and with two prompt groups",
        "diagnostics.md",
        "tests/reference/diagnostics/test_length.py::test_alarm_level_holds_at_small_batches_and_with_two_prompts",
    ),
    Claim(
        "the changepoint test keeps its level on AR(1) series (phi = 0.5) without a change",
        "diagnostics.md",
        "tests/reference/diagnostics/test_trend.py::test_ar1_series_without_a_change_keep_the_level",
    ),
    Claim(
        "every bad input to the reference gets a named error",
        "losses.md",
        "tests/reference/test_validation.py::test_malformed_inputs",
    ),
    # ------------------------------------------------------------------------- kit
    Claim(
        "ids and verdicts are identical serially and under -n 2",
        "conformance.md",
        "tests/pytest/test_plugin.py::test_ids_and_verdicts_identical_serial_and_xdist",
    ),
    Claim(
        "loading the plugin does not import torch",
        "conformance.md",
        "tests/pytest/test_plugin.py::test_plugin_load_does_not_import_torch",
    ),
    Claim(
        "the tolerance model: float32 inside passes with a note and fails strict",
        "tolerance.md",
        "tests/core/test_tolerance.py::test_float32_internal_passes_with_a_note_and_fails_strict",
    ),
    Claim(
        "the diagnosis names an always-on dual clip, a missing stop-gradient and "
        "unpublished constants with their marker line",
        "conformance.md",
        "tests/kinds/policy_loss/diagnose/test_diagnose.py::test_always_on_dual_clip_is_named",
    ),
    # -------------------------------------- documentation and the suite's own honesty
    Claim(
        "each aggregation mode equals its paper's equation, written as Python loops (the "
        "seed claim's bitwise test compares aggregate with token_weights, both reference code)",
        "aggregation.md",
        "tests/reference/test_aggregate.py::test_aggregate_matches_the_papers_equation",
    ),
    Claim(
        "every block of the quickstart runs as written in a throwaway project, its outputs "
        "as shown",
        "quickstart.md",
        "tests/docs/test_quickstart.py::test_every_block_runs_as_written",
    ),
    Claim(
        "every marker keyword is on the options page with the code's default",
        "options.md",
        "tests/docs/test_options_page.py::test_every_marker_keyword_has_a_row_with_its_default",
    ),
    Claim(
        "every command-line and ini option of the plugin is on the options page",
        "options.md",
        "tests/docs/test_options_page.py::test_every_command_line_and_ini_option_is_listed",
    ),
    Claim(
        "masked rollout IS drops out-of-band tokens from every denominator (a mixed keep-mask)",
        "losses.md",
        "tests/mutants/test_rollout_is.py::test_masked_is_drops_out_of_band_tokens_from_every_denominator",
    ),
    Claim(
        "GRPO-TIS truncates at its published cap C = 2 on ratios beyond it",
        "losses.md",
        "tests/mutants/test_rollout_is.py::test_grpo_tis_truncates_at_its_published_cap",
    ),
    Claim(
        "CISPO's gradient is the truncated weight times the advantage, capped tokens included",
        "losses.md",
        "tests/mutants/test_stop_gradient.py::test_cispo_gradient_is_the_truncated_weight_times_the_advantage",
    ),
    Claim(
        "GSPO-token: zero gradient on clipped rows, token-local elsewhere, both sides reached",
        "losses.md",
        "tests/mutants/test_stop_gradient.py::test_gspo_token_gradient_is_zero_on_clipped_rows_and_token_local_elsewhere",
    ),
    Claim(
        "token-sum micro-batches accumulate with sum scaling (the kit's micro-batch check)",
        "aggregation.md",
        "tests/mutants/test_microbatch.py::test_micro_batch_check_accepts_a_correct_token_sum_loss",
    ),
    Claim(
        "the kink band holds at its boundaries (0.5x inside, 1.5x outside)",
        "tolerance.md",
        "tests/mutants/test_kinks.py::test_token_band_native_inputs_scales_with_one_plus_the_log_ratio",
    ),
    Claim(
        "every registry constant is pinned next to its source",
        "registry.md",
        "tests/mutants/test_registry.py::test_registry_constants_are_the_cited_ones",
    ),
    Claim(
        "every test the docs and docstrings name exists",
        "derivations/mutation.md",
        "tests/docs/test_references.py::test_every_named_test_exists",
    ),
    # ------------------------------------------------------- targets, frameworks, safety
    Claim(
        "a training step's accumulated gradient (micro-batches, ranks, generation steps) "
        "equals the full-batch reference; each known accumulation bug is flagged under its "
        "split and named",
        "conformance.md",
        "tests/kinds/training_step/test_kind.py::test_mutant_is_flagged_under_its_split_with_a_diagnosis",
    ),
    Claim(
        "correct token-mean, seq-mean-token-mean, seq-mean-token-sum and token-sum-norm "
        "accumulations pass, also computing in float32",
        "conformance.md",
        "tests/kinds/training_step/test_kind.py::test_correct_accumulation_passes",
    ),
    Claim(
        "wrong advantage estimators (population std, eps in the sqrt, RLOO without G/(G-1), "
        "GAE ignoring dones, ...) are flagged and named",
        "conformance.md",
        "tests/kinds/advantages/test_kind.py::test_wrong_estimators_are_flagged_with_a_diagnosis",
    ),
    Claim(
        "wrong KL penalties (k3 with a flipped log-ratio, k2 without 1/2, missing clamp, ...) "
        "are flagged and named",
        "conformance.md",
        "tests/kinds/kl/test_kind.py::test_wrong_estimator_is_flagged_and_named",
    ),
    Claim(
        "wrong aggregations, value losses and entropy terms are flagged and named",
        "conformance.md",
        "tests/kinds/aggregation/test_kind.py::test_wrong_aggregation_is_flagged",
    ),
    Claim(
        "every correct loss passes every check on 30 pooled batches per check at the "
        "default sizes, in float64, float32 inside, float32 and bfloat16 inputs, and "
        "bfloat16 inputs computed in float32 with strict (no false alarm)",
        "tolerance.md",
        "tests/kinds/policy_loss/test_sweep_correct.py::test_every_correct_loss_passes_every_check_at_default_sizes",
    ),
    Claim(
        "a rollout-IS keep/drop decision within rounding of its band is not judged, and a "
        "wrong band is still caught",
        "tolerance.md",
        "tests/kinds/policy_loss/test_is_decisions.py::test_a_wrong_band_is_caught_in_float64",
    ),
    Claim(
        "a difference visible on the canonical corpus (verl's always-on dual clip) is found "
        "at every seed and under every function name, at 5 examples",
        "conformance.md",
        "tests/core/test_engine_pool.py::test_corpus_finds_the_dual_clip_at_every_seed_and_name",
    ),
    Claim(
        "bugs that only show at realistic sizes (chunked means, truncation at 300 tokens, "
        "past 1024 tokens) are flagged with default options",
        "conformance.md",
        "tests/kinds/policy_loss/test_realistic_sizes.py::test_mutant_is_flagged_with_default_options",
    ),
    Claim(
        "an early-stopped --snapshot-update (-x, Ctrl-C, collection error, crashed worker) "
        "deletes no snapshot, serially and under -n 2",
        "snapshots.md",
        "tests/pytest/test_snapshot_safety.py::test_an_early_stop_deletes_no_snapshot",
    ),
    Claim(
        "reading a golden never runs code: Python, a YAML tag or a pickle in it is a format error",
        "snapshots.md",
        "tests/core/test_golden_no_code.py::test_code_in_a_golden_is_a_format_error_and_never_runs",
    ),
    Claim(
        "parsing a golden is bounded by the file's size: a declared shape larger than its "
        "values is a format error found without allocating it",
        "snapshots.md",
        "tests/core/test_golden_parser_fuzz.py::test_an_enormous_declared_shape_is_a_format_error_without_its_memory",
    ),
    Claim(
        "a golden that is a symbolic link is refused and its target never read or shown",
        "snapshots.md",
        "tests/pytest/test_golden_safety.py::test_a_symlinked_golden_is_refused_and_its_target_never_shown",
    ),
    Claim(
        "a golden's file name is injective over ids; a collision left is an error for both "
        "items, never an overwrite",
        "snapshots.md",
        "tests/pytest/test_golden_safety.py::test_a_collision_left_is_an_error_never_an_overwrite",
    ),
    Claim(
        "a printed replay line with a hostile id runs pytest on that one node and nothing else",
        "conformance.md",
        "tests/pytest/test_replay_quoting.py::test_a_hostile_id_stays_one_word_of_the_replay_line",
    ),
    Claim(
        "at the tolerance= cap a 2x loss still fails value and gradient in every dtype",
        "tolerance.md",
        "tests/core/test_tolerance_cap.py::test_a_multiple_of_the_loss_fails_at_the_cap",
    ),
    Claim(
        "a training step dividing by an empty micro-batch's token count is flagged and named",
        "conformance.md",
        "tests/kinds/training_step/test_empty.py::test_division_by_an_empty_micro_batch_is_flagged_and_named",
    ),
    Claim(
        "a multi-term step is judged term by term: a K-fold term is named with its factor",
        "conformance.md",
        "tests/kinds/training_step/test_terms.py::test_a_k_fold_term_is_named_with_its_factor",
    ),
    Claim(
        "the critic's value loss normalised per micro-batch (verl PR #6957) is flagged as K-fold",
        "conformance.md",
        "tests/kinds/training_step/test_critic.py::test_the_per_micro_batch_value_loss_is_k_fold_and_named",
    ),
    Claim(
        "a critic step marked kind='critic_step' conforms when correct and verl PR #6957's "
        "is flagged under its split and named",
        "conformance.md",
        "tests/kinds/training_step/test_critic_kind.py::test_verl_6957_per_micro_batch_value_loss_is_flagged_and_named",
    ),
    Claim(
        "expect= never excuses a raised exception, a non-finite result or a larger "
        "deviation than declared",
        "conformance.md",
        "tests/core/test_expect_semantics.py::test_a_verdict_is_never_excused",
    ),
    Claim(
        "a declared deviation's size is one number in the -rx reason, the summary table and "
        "the JSON report; a pin at the printed size holds, one below it fails as grown",
        "conformance.md",
        "tests/core/test_expect_sizes.py::test_reason_table_and_json_agree_and_a_pin_at_the_printed_size_holds",
    ),
    Claim(
        "a reproduction snippet too long to print is saved under pytest's basetemp, the "
        "same text the report would print, and the report names the file",
        "conformance.md",
        "tests/pytest/test_saved_snippets.py::test_a_marked_function_saves_its_long_snippet_under_the_basetemp",
    ),
    Claim(
        "every bad input in the table gets its named error, never a traceback",
        "options.md",
        "tests/faces/test_bad_inputs.py::test_the_count_of_bad_inputs",
    ),
    Claim(
        "the frameworks' recorded outputs equal the reference configs claimed for them, "
        "without the frameworks installed",
        "frameworks.md",
        "tests/frameworks/test_recorded.py::test_recorded_outputs_equal_the_claimed_reference",
    ),
    Claim(
        "each recorded framework deviation still shows in the recorded outputs",
        "frameworks.md",
        "tests/frameworks/test_recorded.py::test_recorded_outputs_differ_from_the_named_algorithm",
    ),
    # ------------------------------------------------- logprobs and packed layouts (issue 31)
    Claim(
        "correct logprob functions (plain, TRL-style slicing, chunked over V, rolled labels, "
        "packed, a fixed temperature) pass every logprobs check in float64, float32 and from "
        "bf16 logits",
        "logprobs.md",
        "tests/kinds/logprobs/test_kind.py::test_correct_implementations_pass_every_check",
    ),
    Claim(
        "each logprob bug of issue 31 (missing shift, shift the wrong way, off by one, "
        "temperature missing / twice / rollout side only, bf16 log-softmax, roll across a "
        "packed boundary, sentinel padding) fails the check that names it",
        "logprobs.md",
        "tests/kinds/logprobs/test_kind.py::test_each_bug_fails_the_check_that_names_it",
    ),
    Claim(
        "a torch.roll over the packed stream is named: the sequence it reads across and the "
        "one whose change alone moves it",
        "logprobs.md",
        "tests/kinds/logprobs/test_kind.py::test_packed_boundary_names_the_sequence_and_its_neighbour",
    ),
    Claim(
        "a bf16 log-softmax passes value and fails only float32-log-softmax",
        "logprobs.md",
        "tests/kinds/logprobs/test_kind.py::test_bfloat16_error_is_what_float32_log_softmax_catches",
    ),
    Claim(
        "the logprobs golden replays green and fails when the temperature is applied twice",
        "logprobs.md",
        "tests/kinds/logprobs/test_golden.py::test_the_golden_is_recorded_replayed_and_catches_a_drift",
    ),
    Claim(
        "every correct implementation of the false-alarm sweep gets the same verdict on every "
        "check padded and packed",
        "packed.md",
        "tests/kinds/test_packed.py::test_every_correct_implementation_gets_the_same_verdict_padded_and_packed",
    ),
    Claim(
        "functions written for the packed stream (cu_seqlens or position_ids) pass every check "
        "of the entropy, aggregation, value-loss and advantages kinds",
        "packed.md",
        "tests/kinds/test_packed.py::test_functions_written_for_the_stream_pass_every_check",
    ),
    Claim(
        "reading one token across a packed sequence boundary fails value in the aggregation, "
        "value-loss and advantages kinds",
        "packed.md",
        "tests/kinds/test_packed.py::test_reading_across_a_sequence_boundary_fails_value",
    ),
)


def render(claims: tuple[Claim, ...], link_prefix: str) -> str:
    """A Markdown table: claim | derivation | enforced by."""
    rows = ["| claim | derivation | enforced by |", "|---|---|---|"]
    for c in claims:
        mark = " (seed)" if c.seed else ""
        text = c.text.replace("|", "\\|")  # a bare | would split the table cell
        rows.append(f"| {text}{mark} | [{c.page}]({link_prefix}{c.page}) | `{c.test}` |")
    return "\n".join(rows) + "\n"


def missing_tests() -> list[str]:
    """Claimed node ids whose file or test function does not exist (static check)."""
    out = []
    defined: dict[Path, set[str]] = {}  # each file parsed once (many claims share one)
    for claim in CLAIMS:
        file, _, name = claim.test.partition("::")
        func = name.split("[", 1)[0].split("::")[-1]
        path = ROOT / file
        if not path.is_file():
            out.append(f"{claim.test}: no file {file}")
            continue
        if path not in defined:
            tree = ast.parse(path.read_text())
            defined[path] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        names = defined[path]
        if func not in names:
            out.append(f"{claim.test}: no function {func} in {file}")
    return out


def claimed_by(nodeid: str) -> list[Claim]:
    """The claims that node ``nodeid`` enforces."""
    return [c for c in CLAIMS if nodeid == c.test or nodeid.startswith(c.test + "[")]
