#!/usr/bin/env python3
"""Mutation pass over the sync checks, the divergence bounds and the export rules (issue 26).

Each mutation is one small deliberate bug: (file, an exact snippet that occurs once, its
replacement, the test executables to build, the gtest filter to run, what it breaks). For each,
in a SEPARATE git worktree (never the main checkout, where others build), the script applies
the mutation, builds only the affected test executables in the worktree's own build dir, runs
their filtered tests, records killed (a test failed, crashed or timed out), survived (every
test passed) or not built (the mutant does not compile), and restores the file. A baseline run
without mutations comes first: a failing baseline stops the pass.

The tests are run from the test executables with --gtest_filter rather than through ctest -R:
a ctest regex also matches tests of executables the pass did not build, which ctest then
reports as failures (a false kill).

Usage (stdlib only; builds and tests run under nice -n 19 with one job):
  tools/mutate.py [--repo DIR] [--worktree DIR] [--commit HEAD]
                  [--only ID,ID...] [--out mutation-results.md] [--keep-worktree]
The worktree is created at the commit (or moved to it, discarding its changes), configured once
(cmake -G Ninja -DCMAKE_BUILD_TYPE=Release -DCONCORD_BUILD_BENCH=OFF) and removed at the end
unless --keep-worktree; an interrupted run restores the mutated file before it exits.
"""
import argparse
import os
import tempfile
import signal
import subprocess
import sys
import time

SYNC = "src/concord/rl/sync.cpp"
BOUNDS = "src/concord/audit/bounds.cpp"
EXPORT = "src/concord/train/export.cpp"
EF = "src/concord/numerics/error_feedback.cpp"
BLOCK_REF = "src/concord/numerics/block_ref.cpp"
CONVERT = "src/concord/numerics/convert.cpp"

SYNC_TESTS = [("rl_sync_test", "*")]
BOUNDS_TESTS = [("audit_bounds_test", "*"), ("rl_sync_test", "*Probe*:*stale_weights*:*CleanSync*")]
EXPORT_TESTS = [("train_test", "FairCast.*:Checkpoint.*Export*:Trainer.*:ExportRule.*"),
                ("numerics_test", "ErrorFeedback.*:StochasticRounding.*")]
# Items 19 and 20: without the SIMD-vs-reference comparisons (Simd.*), which caught the SR
# mutation before; the new tests must kill them on their own.
NUMERICS_NO_SIMD = [("numerics_test", "-*Simd*")]

# Issue 40: serving limits and sampling thresholds, the chat template, the W4A8 kernel, the GGUF
# quant decoders and the pre-tokenizers. Every one must be killed by tests in the default ctest
# (no `slow` label, not the Python ones).
SERVER_HTTP = "src/concord/serve/server_http.cpp"
SERVER = "src/concord/serve/server.cpp"
SAMPLING = "src/concord/serve/sampling.cpp"
OPENAI_H = "src/concord/serve/openai.h"
TEXT = "src/concord/serve/text.cpp"
QUANT_GEMM = "src/concord/tensor/quant_gemm.cpp"
GGUF_QUANT = "src/concord/io/gguf_quant.cpp"
SPLIT = "src/concord/io/tokenizer_split.cpp"
SERVE_TESTS = [("serve_test", "*")]
QUANT_GEMM_TESTS = [("tensor_test", "*Quant*")]
GGUF_TESTS = [("io_test", "*")]
TOKENIZER_TESTS = [("tokenizer_test", "*")]

# id, area, file, original, replacement, tests, description
MUTATIONS = [
    # ---- check 1 version
    ("c1-drop", "check 1", SYNC, "if (sent != version)", "if (false && sent != version)", SYNC_TESTS,
     "drop the payload-version == announced-version comparison"),
    ("c1-wrong-field", "check 1", SYNC, "if (sent != version)", "if (sent != version_ + 1)", SYNC_TESTS,
     "compare the payload version with the serving version + 1, not the announced one"),
    ("c1-older-off-by-one", "check 1", SYNC, "if (has_version_ && version < version_)",
     "if (has_version_ && version + 1 < version_)", SYNC_TESTS,
     "off by one in 'not older than the serving version'"),
    # ---- check 2 manifest
    ("c2-fast-path-always", "check 2", SYNC, "if (same) return \"\";", "if (same || true) return \"\";", SYNC_TESTS,
     "always-pass: a byte-equal manifest text passes without looking at the payload's tensors"),
    ("c2-tie-dropped", "check 2", SYNC, "            if (spec)\n              return fmt::format(\"{}: the learner ties it",
     "            if (false)\n              return fmt::format(\"{}: the learner ties it", SYNC_TESTS,
     "drop the tied-embeddings check"),
    ("c2-extra-tensor", "check 2", SYNC,
     "if (t.name != kProbeTensor && !listed.count(t.name))",
     "if (false && t.name != kProbeTensor && !listed.count(t.name))", SYNC_TESTS,
     "drop 'in the payload but not in the manifest'"),
    ("c2-sampler-side-skip-last", "check 2", SYNC, "  for (const ManifestEntry& s : sampler)\n    if (!listed.count(s.name))",
     "  for (const ManifestEntry& s : std::span<const ManifestEntry>(sampler).first(sampler.size() - 1))\n    if (!listed.count(s.name))", SYNC_TESTS,
     "off by one: the last sampler tensor may be missing from the manifest"),
    ("c2-dtype", "check 2", SYNC, "    if (entry.dtype != spec->dtype)",
     "    if (false && entry.dtype != spec->dtype)", SYNC_TESTS,
     "drop the served-dtype comparison"),
    # ---- check 3 precision plan
    ("c3-always", "check 3", SYNC,
     "if (sent_plan != file->metadata().end() && sent_plan->second == expected_plan_) return \"\";",
     "if (sent_plan != file->metadata().end() || true) return \"\";", SYNC_TESTS,
     "always-pass the precision plan"),
    ("c3-only-a", "check 3", SYNC, "if (l.a != s.a || l.b != s.b)", "if (l.a != s.a)", SYNC_TESTS,
     "compare the wrong field: activation format only, not the weight format"),
    ("c3-only-b", "check 3", SYNC, "if (l.a != s.a || l.b != s.b)", "if (l.b != s.b)", SYNC_TESTS,
     "compare the wrong field: weight format only, not the activation format"),
    ("c3-last-layers", "check 3", SYNC, "if (learner.last_layers != sampler.last_layers)", "if (false)",
     SYNC_TESTS, "drop the high-precision last-layers comparison"),
    # ---- check 5 derived state
    ("c5-drop", "check 5", SYNC, "if (w.source_hash != installed_of(w).hash)", "if (false)", SYNC_TESTS,
     "drop the stale-copy check"),
    ("c5-skip-last", "check 5", SYNC,
     "        for (const Derived& w : derived)\n          if (w.source_hash",
     "        for (const Derived& w : std::span<const Derived>(derived).first(derived.size() - 1))\n"
     "          if (w.source_hash", SYNC_TESTS, "off by one: every copy but the last"),
    # ---- check 6 scale sanity
    ("c6-drop", "check 6", SYNC,
     "if (!problem.empty()) return fmt::format(\"{} ({}): {}\"",
     "if (false) return fmt::format(\"{} ({}): {}\"", SYNC_TESTS, "drop the scale-sanity check"),
    ("c6-zero-scale", "check 6", SYNC, "if (code == 0x00 && block_has_nonzero(q, gr, gc))",
     "if (code == 0x00 && block_has_nonzero(q, gr, gc) && false)",
     SYNC_TESTS, "drop 'zero / placeholder scale on a nonzero block'"),
    ("c6-nan-scale", "check 6", SYNC, "    if (code >= invalid_from)\n      return",
     "    if (false)\n      return", SYNC_TESTS, "drop 'NaN block scale code'"),
    ("c6-skip-last", "check 6", SYNC, "        for (const Derived& w : derived) {\n          const std::string problem = operand_scale_problem(",
     "        for (const Derived& w : std::span<const Derived>(derived).first(derived.size() - 1)) {\n          const std::string problem = operand_scale_problem(", SYNC_TESTS, "off by one: every weight's scales but the last"),
    ("c6-tensor-scale", "check 6", SYNC, "  if (q.tensor_scale != expected)\n", "  if (false)\n", SYNC_TESTS,
     "drop 'tensor scale = the one the amax gives'"),
    ("c6-scan-off-by-one", "check 6", SYNC, "  for (size_t i = 0; i < q.scales.size(); ++i) {\n    low =",
     "  for (size_t i = 0; i + 1 < q.scales.size(); ++i) {\n    low =", SYNC_TESTS,
     "off by one: the min/max scan misses the last block scale"),
    # ---- check 4 content
    ("c4-skip-last (item 17)", "check 4", SYNC, "        for (const Derived& w : derived) {\n          const uint64_t sample = sample_hash(",
     "        for (const Derived& w : std::span<const Derived>(derived).first(derived.size() - 1)) {\n          const uint64_t sample = sample_hash(", SYNC_TESTS,
     "compare every tensor but the last one in visit_derived_weights order"),
    ("c4-no-resample (item 18)", "check 4", SYNC, "if (sample != w.codes_sample)", "if (false)", SYNC_TESTS,
     "drop the re-sample of the codes (changed after the copy was built)"),
    ("c4-fast-path-always", "check 4", SYNC,
     "if (sent != file->metadata().end() && sent->second == content_text(mine)) return \"\";",
     "if (sent != file->metadata().end() || true) return \"\";", SYNC_TESTS,
     "always-pass the content hashes"),
    ("c4-no-scales", "check 4", SYNC, "  const uint64_t h = XXH3_64bits_withSeed(scales.data(), scales.size(), codes_hash);",
     "  const uint64_t h = codes_hash + 0 * scales.size();", SYNC_TESTS, "content hash leaves out the block scales"),
    ("c4-no-tensor-scale", "check 4", SYNC, "return XXH3_64bits_withSeed(&scale_bits, sizeof scale_bits, h);",
     "return (void)scale_bits, h;", SYNC_TESTS, "content hash leaves out the tensor scale"),
    ("c4-sample-skips-first-line", "check 4", SYNC, "for (size_t at = 0; at + kLine <= codes.size(); at += kStride)",
     "for (size_t at = kLine; at + kLine <= codes.size(); at += kStride)", SYNC_TESTS,
     "the codes sample starts one line late"),
    # ---- check 7 probe
    ("c7-contract-dropped", "check 7", SYNC, "if (!verdict.pass) {", "if (false) {", SYNC_TESTS,
     "drop the kernel-contract verdict (the k3 KL threshold alone remains)"),
    ("c7-k3-dropped", "check 7", SYNC, "if (k3 > probe_.max_k3_kl) return", "if (false) return", SYNC_TESTS,
     "drop the k3 KL threshold"),
    ("c7-rows-off-by-one", "check 7", SYNC, "for (size_t i = 0; i < infos.size(); ++i) {",
     "for (size_t i = 0; i + 1 < infos.size(); ++i) {", SYNC_TESTS, "off by one: the last probe row unchecked"),
    # ---- divergence bounds
    ("b-tv-osc/2", "bounds", BOUNDS, "  return std::tanh(eps / 4);", "  return std::tanh(eps / 2);", BOUNDS_TESTS,
     "TV bound tanh(osc/4) -> tanh(osc/2) (looser)"),
    ("b-tv-osc/8", "bounds", BOUNDS, "  return std::tanh(eps / 4);", "  return std::tanh(eps / 8);", BOUNDS_TESTS,
     "TV bound tanh(osc/4) -> tanh(osc/8) (too tight)"),
    ("b-kl-min-max", "bounds", BOUNDS, "std::fmin(eps * eps / 8, eps * std::tanh(eps / 4))",
     "std::fmax(eps * eps / 8, eps * std::tanh(eps / 4))", BOUNDS_TESTS, "KL bound min -> max"),
    ("b-margin-slack-sign", "bounds", BOUNDS, "return margin_ref > eps * (1 + 0x1p-40) + DBL_MIN;",
     "return margin_ref > eps * (1 - 0x1p-40) + DBL_MIN;", BOUNDS_TESTS, "flip predictor: slack sign flipped"),
    ("b-margin-half", "bounds", BOUNDS, "return margin_ref > eps * (1 + 0x1p-40) + DBL_MIN;",
     "return margin_ref > eps / 2 * (1 + 0x1p-40) + DBL_MIN;", BOUNDS_TESTS,
     "flip predictor: margin compared with osc/2"),
    ("b-seq-tv", "bounds", BOUNDS, "log_stay += std::log1p(-std::tanh(e / 4));",
     "log_stay += std::log1p(-std::tanh(e / 8));", BOUNDS_TESTS, "sequence TV from tanh(osc/8)"),
    ("b-osc-error-term", "bounds", BOUNDS, "(scan.diff_max - scan.diff_min) + 2 * scan.diff_error;",
     "(scan.diff_max - scan.diff_min) + scan.diff_error;", BOUNDS_TESTS, "osc counts the rounding error once"),
    ("b-ratio", "bounds", BOUNDS, "return {std::exp(-eps), std::exp(eps)};",
     "return {std::exp(-eps / 2), std::exp(eps)};", BOUNDS_TESTS, "ratio bound exp(-osc) -> exp(-osc/2)"),
    ("b-pg-bias", "bounds", BOUNDS, "return 2 * g_max * sequence_tv;", "return g_max * sequence_tv;",
     BOUNDS_TESTS, "policy-gradient bias bound without its factor 2"),
    ("b-dlogp-max-min", "bounds", BOUNDS, "out.max_abs_dlogp = std::fmax(",
     "out.max_abs_dlogp = std::fmin(", BOUNDS_TESTS, "max |dlogp| from the wrong extreme"),
    # ---- export rules and the numerics under them
    ("e-rne-rtz", "export", EXPORT, "RoundingExport>(served, Rounding::rne, seed);",
     "RoundingExport>(served, Rounding::rtz, seed);", EXPORT_TESTS, "export rule rne rounds toward zero"),
    ("e-sr-same-stream", "export", EXPORT, "                                     static_cast<uint32_t>(param)};",
     "                                     static_cast<uint32_t>(param) * 0u};", EXPORT_TESTS, "sr export: every parameter draws the same stream"),
    ("e-sr-same-step", "export", EXPORT, "(0x9E3779B97F4A7C15ull * (step + 1))", "(0x9E3779B97F4A7C15ull * (step * 0 + 1))",
     EXPORT_TESTS, "sr export: the same random words every step"),
    ("e-ef-no-state", "export", EXPORT, "bool keeps_state() const override { return desc_.element != Format::f32; }",
     "bool keeps_state() const override { return false; }", EXPORT_TESTS,
     "ef export says it keeps no state (checkpoints drop the error)"),
    ("ef-carry-sign", "export", EF, "error_[i] = carried_[i] - dequantized_[i];",
     "error_[i] = dequantized_[i] - carried_[i];", EXPORT_TESTS, "error feedback: wrong carry sign"),
    ("ef-no-carry", "export", EF, "carried_[i] = x[i] + error_[i];", "carried_[i] = x[i];", EXPORT_TESTS,
     "error feedback: the carried error is never added"),
    ("sr-neighbours-ref (item 20)", "numerics", BLOCK_REF, "rng.word(static_cast<uint64_t>(i))",
     "rng.word(static_cast<uint64_t>(i) & ~uint64_t{1})", NUMERICS_NO_SIMD,
     "block SR reference: elements 2k and 2k+1 share a random word"),
    ("sr-neighbours-array (item 20)", "numerics", CONVERT, "rng.word(first_index + i)",
     "rng.word((first_index + i) & ~uint64_t{1})", NUMERICS_NO_SIMD,
     "encode_array SR: elements 2k and 2k+1 share a random word"),
    ("rceil-subnormal-tie (item 19)", "numerics", BLOCK_REF, "field == 0 ? mantissa > 0x400000u",
     "field == 0 ? mantissa >= 0x400000u", NUMERICS_NO_SIMD,
     "RCEIL: descale exactly 2^-127 rounded up to 2^-126"),
    ("even-half-down", "numerics", BLOCK_REF, "(uint64_t{1} << (22 - t.mantissa_bits))",
     "((uint64_t{1} << (22 - t.mantissa_bits)) - 1)", NUMERICS_NO_SIMD, "EVEN: ties rounded down"),
    # ---- serving limits (issue 40)
    ("s-context-exact-fit", "serve limits", SERVER_HTTP, "if (r.max_tokens && p + *r.max_tokens > context)",
     "if (r.max_tokens && p + *r.max_tokens >= context)", SERVE_TESTS,
     "prompt + max_tokens filling the context exactly is rejected"),
    ("s-context-prompt", "serve limits", SERVER_HTTP, "  if (p >= context)\n", "  if (p > context)\n",
     SERVE_TESTS, "a prompt that fills the whole context is admitted"),
    ("s-queue-n", "serve limits", SERVER_HTTP, "  if (n > options.max_queue)\n", "  if (n >= options.max_queue)\n",
     SERVE_TESTS, "n == --max-queue is refused"),
    ("s-queue-bound", "serve limits", SERVER_HTTP, "if (inbox_choices + engine_waiting + n > options.max_queue)",
     "if (inbox_choices + engine_waiting + n >= options.max_queue)", SERVE_TESTS,
     "the queue admits one choice fewer than --max-queue"),
    ("s-body-chunked", "serve limits", SERVER_HTTP,
     "if (body.size() + size > static_cast<size_t>(options.max_body_bytes))",
     "if (body.size() + size >= static_cast<size_t>(options.max_body_bytes))", SERVE_TESTS,
     "a chunked body of exactly --max-body-bytes is refused"),
    ("s-body-length", "serve limits", SERVER,
     "set_payload_max_length(static_cast<size_t>(m.options.max_body_bytes));",
     "set_payload_max_length(static_cast<size_t>(m.options.max_body_bytes) - 1);", SERVE_TESTS,
     "a Content-Length body of exactly --max-body-bytes is refused"),
    ("s-top-logprobs", "serve limits", OPENAI_H, "kMaxTopLogprobs = 20;", "kMaxTopLogprobs = 19;",
     SERVE_TESTS, "top_logprobs / logprobs capped at 19, not 20"),
    ("s-max-choices", "serve limits", OPENAI_H, "kMaxChoices = 128;", "kMaxChoices = 127;", SERVE_TESTS,
     "n capped at 127, not 128"),
    ("s-stop-flush", "serve limits", TEXT, "  std::string rest = std::move(held_);",
     "  std::string rest;", SERVE_TESTS, "a held-back suffix is dropped at the end of the output"),
    # ---- sampling thresholds (issue 40)
    ("p-min-p-equal", "sampling", SAMPLING, "return p[i] < threshold && i != top;",
     "return p[i] <= threshold && i != top;", SERVE_TESTS,
     "min-p drops a token whose p equals min_p * p_max (the rule keeps it)"),
    ("p-top-p-reach", "sampling", SAMPLING, "if (running >= target) break;", "if (running > target) break;",
     SERVE_TESTS, "top-p needs more than the target mass, not just to reach it"),
    ("p-top-k-vocab", "sampling", SAMPLING, "if (params.top_k > 0 && params.top_k < V)",
     "if (params.top_k > 0 && params.top_k < V - 1)", SERVE_TESTS, "top_k = V - 1 keeps the whole vocabulary"),
    ("p-top-p-range", "sampling", SAMPLING, "if (!(top_p > 0.0f && top_p <= 1.0f))",
     "if (!(top_p > 0.0f && top_p < 1.0f))", SERVE_TESTS, "top_p = 1 (off) refused"),
    ("p-min-p-range", "sampling", SAMPLING, "if (!(min_p >= 0.0f && min_p <= 1.0f))",
     "if (!(min_p >= 0.0f && min_p < 1.0f))", SERVE_TESTS, "min_p = 1 refused"),
    # ---- chat template (issue 40)
    ("t-escape-newline", "chat template", TEXT, "            case 'n': unescaped = \"\\n\"; break;\n", "",
     SERVE_TESTS, "the default system literal's \\n escapes stay as written"),
    ("t-escape-tab", "chat template", TEXT, "            case 't': unescaped = \"\\t\"; break;\n", "",
     SERVE_TESTS, "the default system literal's \\t escapes stay as written"),
    ("t-escape-backslash", "chat template", TEXT, "            case '\\\\': unescaped = \"\\\\\"; break;\n", "",
     SERVE_TESTS, "an escaped backslash stays doubled"),
    # ---- the W4A8 kernel's activation quantization (issue 40)
    ("q-inv-scale", "quant_gemm", QUANT_GEMM, "const float inv = 127.0f / amax;",
     "const float inv = 1.0f / d32;", QUANT_GEMM_TESTS, "codes from 1/d instead of ggml's 127/amax"),
    ("q-round-away", "quant_gemm", QUANT_GEMM, "const float r = std::nearbyint(xb[i] * inv);",
     "const float r = std::round(xb[i] * inv);", QUANT_GEMM_TESTS, "activation codes round ties away from zero"),
    ("q-sum-scale-fp32", "quant_gemm", QUANT_GEMM,
     "s[b] = f16_to_f32(f32_to_f16(d32 * static_cast<float>(total)));",
     "s[b] = d32 * static_cast<float>(total);", QUANT_GEMM_TESTS, "the q4_1 block sum kept in fp32, not fp16"),
    # ---- GGUF quant decoders (issue 40)
    ("g-q4_0-offset", "gguf decoders", GGUF_QUANT, "y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;",
     "y[j] = static_cast<float>((qs[j] & 0x0F) - 7) * d;", GGUF_TESTS, "q4_0 low nibbles offset by 7"),
    ("g-q4_1-high", "gguf decoders", GGUF_QUANT, "y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;",
     "y[j + 16] = static_cast<float>((qs[j] >> 4) & 7) * d + m;", GGUF_TESTS, "q4_1 high nibbles lose their top bit"),
    ("g-q5_0-high-bit", "gguf decoders", GGUF_QUANT, "(((qh >> (j + 16)) & 1u) << 4)) - 16;",
     "(((qh >> j) & 1u) << 4)) - 16;", GGUF_TESTS, "q5_0 high half reads the low half's fifth bits"),
    ("g-q3_k-scale", "gguf decoders", GGUF_QUANT, "const int low = s < 8 ? (sc[s] & 0x0F) : (sc[s - 8] >> 4);",
     "const int low = s < 8 ? (sc[s] & 0x0F) : (sc[s - 8] & 0x0F);", GGUF_TESTS,
     "q3_K scales 8..15 from the low nibbles"),
    # ---- pre-tokenizers (issue 40)
    ("k-digits-stretch", "pre-tokenizer", SPLIT, "const Text stretch{t.cp, t.flags, stop};",
     "const Text stretch{t.cp, t.flags, t.n};", TOKENIZER_TESTS,
     "Digits+ByteLevel: the GPT-2 regex sees past the digit that ends its stretch"),
    ("k-digits-grouped", "pre-tokenizer", SPLIT,
     "        pieces.emplace_back(scratch.offsets[i], scratch.offsets[i + 1]);\n        ++i;",
     "        size_t j = i + 1;\n        while (j < t.n && (t.flags[j] & kNumber)) ++j;\n"
     "        pieces.emplace_back(scratch.offsets[i], scratch.offsets[j]);\n        i = j;", TOKENIZER_TESTS,
     "Digits+ByteLevel: a run of digits is one piece"),
    ("k-llama3-digits", "pre-tokenizer", SPLIT, "case SplitPattern::kLlama3: e = match_qwen2(t, i, 3);",
     "case SplitPattern::kLlama3: e = match_qwen2(t, i, 2);", TOKENIZER_TESTS, "Llama 3 numbers in pieces of 2 digits"),
    ("k-qwen2-max-digits", "pre-tokenizer", SPLIT, "while (e < i + max_digits && t.has(e, kNumber)) ++e;",
     "while (e <= i + max_digits && t.has(e, kNumber)) ++e;", TOKENIZER_TESTS,
     "Qwen2/Llama 3 numbers one digit longer than allowed"),
]


# Run first (the table keeps the order above): the issue's own mutations, then the ones a
# reading of the tests suggested might survive, so a pass cut short still answers those.
RUN_FIRST = ("item", "c3-only-a", "c3-last-layers", "c5-skip-last", "c6-tensor-scale", "c6-scan",
             "c7-k3", "c7-rows", "b-osc", "e-sr-same-stream", "c2-extra", "c2-sampler", "c2-dtype",
             "c6-nan", "c6-skip-last")


def run(cmd, cwd=None, timeout=None, env=None):
    return subprocess.run(cmd, cwd=cwd, timeout=timeout, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def git(repo, *args):
    r = run(["git", "-C", repo, *args])
    if r.returncode != 0:
        sys.exit(f"mutate: git {' '.join(args)} failed in {repo}: {r.stdout.strip()}")
    return r.stdout.strip()


def setup_worktree(repo, wt, commit):
    sha = git(repo, "rev-parse", commit)
    if not os.path.isdir(wt):
        git(repo, "worktree", "add", "--detach", wt, sha)
    else:
        git(wt, "checkout", "--", ".")  # a previous run's leftovers (this worktree only)
        git(wt, "checkout", "--detach", sha)
    build = os.path.join(wt, "build")
    if not os.path.exists(os.path.join(build, "build.ninja")):
        r = run(["nice", "-n", "19", "cmake", "-S", wt, "-B", build, "-G", "Ninja",
                 "-DCMAKE_BUILD_TYPE=Release", "-DCONCORD_BUILD_BENCH=OFF"])
        if r.returncode != 0:
            sys.exit("mutate: cmake configure failed:\n" + r.stdout[-3000:])
    return sha, build


def build(build_dir, targets):
    r = run(["nice", "-n", "19", "ninja", "-C", build_dir, "-j1", *targets], timeout=3600)
    return r.returncode == 0, r.stdout


def run_tests(build_dir, tests):
    """True when every test passed; else False and the first failing output's tail."""
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    for exe, flt in tests:
        try:
            r = run(["nice", "-n", "19", os.path.join(build_dir, "bin", exe), f"--gtest_filter={flt}",
                     "--gtest_brief=1"], cwd=os.path.dirname(build_dir), timeout=600, env=env)
        except subprocess.TimeoutExpired:
            return False, f"{exe}: timed out"
        if r.returncode != 0:
            # "[  FAILED  ] Suite.Test/param, where GetParam() = <bytes> (3 ms)": the name only.
            failed = [ln.split(", where GetParam()")[0].split(" (")[0].replace("[  FAILED  ] ", "")
                      for ln in r.stdout.splitlines() if ln.startswith("[  FAILED  ]")]
            return False, f"{exe}: " + ("; ".join(failed[:3]) if failed else f"exit {r.returncode}")
    return True, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the repository (default: the one holding this script)")
    ap.add_argument("--worktree", default=os.path.join(tempfile.gettempdir(), "concord-mutate"),
                    help="where the worktree goes (default: $TMPDIR/concord-mutate)")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--only", default="", help="comma-separated mutation ids (prefixes)")
    ap.add_argument("--out", default="mutation-results.md")
    ap.add_argument("--keep-worktree", action="store_true")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of an existing --out table for the mutations not run now")
    args = ap.parse_args()

    chosen = [m for m in MUTATIONS
              if not args.only or any(m[0].startswith(p) for p in args.only.split(","))]
    if not chosen:
        sys.exit(f"mutate: --only {args.only} matches no mutation id")
    sha, build_dir = setup_worktree(args.repo, args.worktree, args.commit)
    targets = sorted({exe for m in chosen for exe, _ in m[5]})
    ok, log = build(build_dir, targets)
    if not ok:
        sys.exit("mutate: the unmutated tree does not build:\n" + log[-3000:])
    all_tests = sorted({t for m in chosen for t in m[5]})
    ok, why = run_tests(build_dir, all_tests)
    if not ok:
        sys.exit(f"mutate: the baseline fails ({why}); fix that before a mutation pass")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit("mutate: terminated"))
    rank = {m[0]: i for i, m in enumerate(MUTATIONS)}
    first = lambda m: next((i for i, p in enumerate(RUN_FIRST) if p in m[0]), len(RUN_FIRST))
    rows = []
    kept = read_table(args.out) if args.merge else {}
    ran = {m[0] for m in chosen}
    kept = {k: v for k, v in kept.items() if k not in ran and k in rank}
    try:
        for mid, area, path, old, new, tests, desc in sorted(chosen, key=lambda m: (first(m), rank[m[0]])):
            full = os.path.join(args.worktree, path)
            with open(full, encoding="utf-8") as f:
                original = f.read()
            t0 = time.time()
            if original.count(old) != 1:
                rows.append((mid, area, path, desc, "error", f"snippet found {original.count(old)} times", 0, sha))
                continue
            try:
                with open(full, "w", encoding="utf-8") as f:
                    f.write(original.replace(old, new))
                built, log = build(build_dir, sorted({exe for exe, _ in tests}))
                if not built:
                    verdict, detail = "not built", log.strip().splitlines()[-1][:120] if log.strip() else ""
                else:
                    passed, why = run_tests(build_dir, tests)
                    verdict, detail = ("survived", "") if passed else ("killed", why)
            finally:
                with open(full, "w", encoding="utf-8") as f:
                    f.write(original)
            rows.append((mid, area, path, desc, verdict, detail, time.time() - t0, sha))
            write_table(args.out, sorted(rows + list(kept.values()), key=lambda r: rank[r[0]]))
            print(f"{verdict:9s} {mid}  {detail[:100]}", flush=True)
    finally:
        git(args.worktree, "checkout", "--", ".")
        write_table(args.out, sorted(rows + list(kept.values()), key=lambda r: rank[r[0]]))
        if not args.keep_worktree:
            run(["git", "-C", args.repo, "worktree", "remove", "--force", args.worktree])
    survived = [r for r in rows if r[4] != "killed"]
    print(f"{len(rows) - len(survived)} of {len(rows)} killed; table in {args.out}")


HEADER = "| id | area | file | mutation | verdict | first failure | s | commit |"


def write_table(out, rows):
    killed = sum(r[4] == "killed" for r in rows)
    with open(out, "w", encoding="utf-8") as f:
        f.write(f"{killed} of {len(rows)} mutations killed.\n\n")
        f.write(HEADER + "\n|---|---|---|---|---|---|---|---|\n")
        for mid, area, path, desc, verdict, detail, secs, sha in rows:
            cell = detail.replace("|", "\\|")
            f.write(f"| {mid} | {area} | {os.path.basename(path)} | {desc} | **{verdict}** | {cell} | "
                    f"{secs:.0f} | {sha[:10]} |\n")


def read_table(out):
    """The rows of a table written by write_table, by mutation id ({} when there is none)."""
    if not os.path.exists(out):
        return {}
    paths = {os.path.basename(m[2]): m[2] for m in MUTATIONS}
    rows = {}
    with open(out, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("| ") or line.startswith(HEADER[:6]):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if len(cells) != 8 or cells[0] == "id":
                continue
            mid, area, base, desc, verdict, detail, secs, sha = cells
            rows[mid] = (mid, area, paths.get(base, base), desc, verdict.strip("*"), detail.replace("\\|", "|"),
                         float(secs), sha)
    return rows


if __name__ == "__main__":
    main()
