"""The real engine process on tiny models: load, generate, reuse, stop, context, templates."""
from __future__ import annotations

import pytest

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient, EngineError
from tests.engine.conftest import TINY_LOAD
from tests.engine.helpers import collect, greedy
from tests.fixtures import ggufs

PROMPT = "hello the cat and the dog were in the house"


def test_loaded_event_describes_the_model(engine, tiny_model):
    ld = engine.loaded
    assert ld.model == str(tiny_model) and ld.arch == "llama"
    assert ld.n_ctx == 512 and ld.n_layer == 2 and ld.n_vocab > 256
    assert ld.chat_format == "completion"  # no template in the tiny model
    assert ld.memory["weights"] > 0 and ld.memory["kv"] > 0 and ld.memory["compute"] > 0


def test_greedy_is_deterministic_and_reports_stats(engine):
    a = collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(20)))
    b = collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(20)))
    assert a.error is None and a.done.finish_reason == "length"
    assert a.text == b.text and a.done.text == a.text
    assert a.stats.final and a.stats.n_gen == 20 and a.done.usage["completion_tokens"] == 20
    assert a.stats.ttft_s > 0 and a.stats.decode_tok_s > 0 and a.stats.prefill_tok_s > 0
    # llama.cpp's own timings ride along: 19 one-token decodes after the prompt (a one-token
    # prompt remainder after prefix reuse is a one-token decode too, hence 19 or 20)
    perf = b.stats.llama_perf
    assert perf["eval_tokens"] in (19, 20) and perf["eval_tok_s"] > 0


def test_prefix_reuse_skips_what_is_cached(engine):
    first = collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(4)))
    second = collect(engine, engine.generate(prompt=PROMPT + first.text + " and more", sampling=greedy(4)))
    assert second.stats.n_reused >= first.stats.n_prompt - 1
    # the reused answer is the same as from a cold cache
    engine.generate(prompt="something else entirely", sampling=greedy(2))
    cold = collect(engine, engine.generate(prompt=PROMPT + first.text + " and more", sampling=greedy(4)))
    assert cold.text == second.text


def test_chunked_prefill_reports_progress(engine):
    long_prompt = " ".join(["the cat"] * 40)  # > n_batch (64) tokens
    r = collect(engine, engine.generate(prompt=long_prompt, sampling=greedy(2)))
    assert r.error is None
    assert len(r.progress) >= 3 and r.progress[-1].done == r.progress[-1].total


def test_stop_string_ends_generation_and_is_not_shown(engine):
    full = collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(30))).text
    stop = full[10:14]
    assert stop.strip(), full
    r = collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(30, stop=[stop])))
    assert r.done.finish_reason == "stop"
    assert r.text == full[: full.index(stop)]


def test_prompt_longer_than_context_is_refused_cleanly(engine):
    long = " ".join(["cat"] * 600)
    r = collect(engine, engine.generate(prompt=long, sampling=greedy(4, context_overflow="error")))
    assert r.error is not None and r.error.kind == "context"
    assert "context" in r.error.message
    ok = collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(2)))
    assert ok.error is None
    rolled = collect(engine, engine.generate(prompt=long, sampling=greedy(4)))  # the default: rolling
    assert rolled.error is None and rolled.done.overflow == "rolling"
    assert rolled.done.usage["truncated_tokens"] + rolled.done.usage["prompt_tokens"] > 512


def test_generation_stops_at_full_context(engine):
    r = collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(2000)))
    assert r.done.finish_reason == "context"  # not max_tokens: the context had no room left
    assert r.stats.n_prompt + r.stats.n_gen <= 512 + 1


def test_chat_without_template_uses_builtin_and_drops_oldest_turns(engine):
    msgs = [{"role": "system", "content": "be brief"}]
    for _ in range(40):
        msgs += [{"role": "user", "content": "the cat " * 10}, {"role": "assistant", "content": "dog " * 10}]
    msgs.append({"role": "user", "content": "hello"})
    r = collect(engine, engine.generate(messages=msgs, sampling=greedy(8)))
    assert r.error is None, r.error
    assert r.stats.n_prompt <= 512 - 8
    assert r.done.usage["truncated_tokens"] > 0 and r.done.overflow == "rolling"
    refused = collect(engine, engine.generate(messages=msgs, sampling=greedy(8, context_overflow="error")))
    assert refused.error.kind == "context"


def test_bad_sampling_settings_give_a_clear_error(engine):
    # refused before the engine sees it (the settings travel typed: engine/link/protocol.py settings_of)
    with pytest.raises(SettingsError, match="temperature"):
        engine.generate(prompt=PROMPT, sampling={"temperature": -3})
    assert collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(2))).error is None  # and it goes on


def test_cancel_mid_generation(engine):
    rid = engine.generate(prompt=PROMPT, sampling=greedy(400))
    seen = 0
    for ev in engine.stream(rid):
        if isinstance(ev, P.Token):
            seen += 1
            if seen == 3:
                engine.cancel(rid)
        if isinstance(ev, P.Done):
            assert ev.finish_reason == "cancelled"
            break
    assert 3 <= seen < 400
    assert collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(3))).error is None


def test_cancel_before_start(engine):
    rid = "early"
    engine.cancel(rid)
    r = collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(5), request_id=rid))
    assert r.done.finish_reason == "cancelled" and r.tokens == 0


def test_garbage_on_stdin_is_reported_and_survived(engine):
    engine.proc.stdin.write(b"this is not json\n")
    engine.proc.stdin.flush()
    assert collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(2))).error is None


def test_greedy_matches_llama_cpp_python(tiny_model, engine):
    """Token for token against llama-cpp-python's own high-level generate (temperature 0)."""
    from llama_cpp import Llama

    llm = Llama(str(tiny_model), n_ctx=512, n_batch=64, n_threads=1, n_threads_batch=1, verbose=False)
    ref = []
    for tok in llm.generate(llm.tokenize(PROMPT.encode(), special=True), temp=0.0):
        ref.append(tok)
        if len(ref) == 40:
            break
    done = collect(engine, engine.generate(prompt=PROMPT, sampling=greedy(40))).done
    assert done.tokens == ref
    text = llm.create_completion(PROMPT, max_tokens=40, temperature=0)["choices"][0]["text"]
    assert done.text.replace("\ufffd", "") == text  # llama-cpp-python drops broken UTF-8; we mark it


def test_chatml_template_is_used(tiny_chatml):
    with EngineClient() as c:
        ld = c.load(str(tiny_chatml), settings=TINY_LOAD)
        assert ld.chat_format == "template"
        r = collect(c, c.generate(messages=[{"role": "user", "content": "hello"}], sampling=greedy(5)))
        assert r.error is None and r.stats.n_prompt > 5


@pytest.mark.parametrize("kind", ["truncated", "zero_layers", "unknown_arch", "no_byte_tokens", "not_gguf"])
def test_malformed_model_gives_load_error_and_engine_lives_on(kind, tmp_path, tiny_model):
    bad = ggufs.write_malformed(kind, tmp_path)
    with EngineClient() as c:
        with pytest.raises(EngineError) as e:
            c.load(str(bad), settings=TINY_LOAD)
        assert e.value.event.kind == "load"
        assert bad.name in e.value.event.message
        # whatever happened (error or abort), a good model loads and generates afterwards
        c.load(str(tiny_model), settings=TINY_LOAD)
        assert collect(c, c.generate(prompt=PROMPT, sampling=greedy(3))).error is None


def test_template_with_syntax_error_falls_back_to_completion(tmp_path):
    bad = ggufs.write_malformed("template_syntax_error", tmp_path)
    with EngineClient() as c:
        ld = c.load(str(bad), settings=TINY_LOAD)
        errors = [e for e in c.events(timeout=0.2) if isinstance(e, P.Error)]
        assert ld.chat_format == "completion"
        assert errors and errors[0].kind == "template" and "template" in errors[0].message
        assert collect(c, c.generate(prompt=PROMPT, sampling=greedy(3))).error is None


def test_template_escaping_the_sandbox_is_blocked(tmp_path):
    evil = ggufs.write_malformed("template_escape", tmp_path)
    with EngineClient() as c:  # refused at load (the probe render), not at the first message
        ld = c.load(str(evil), settings=TINY_LOAD)
        errors = [e for e in c.events(timeout=0.2) if isinstance(e, P.Error)]
        assert ld.chat_format == "completion"
        assert errors and errors[0].kind == "template" and "unsafe" in errors[0].message
        assert collect(c, c.generate(prompt=PROMPT, sampling=greedy(3))).error is None


def test_bad_load_settings_and_missing_file(tiny_model, tmp_path):
    with EngineClient() as c:
        with pytest.raises(SettingsError, match="micro-batch"):  # refused before it is sent
            c.load(str(tiny_model), settings={"n_batch": 32, "n_ubatch": 64})
        with pytest.raises(EngineError, match="not found"):
            c.load(str(tmp_path / "nope.gguf"), settings=TINY_LOAD)
        with pytest.raises(SettingsError, match="warp_drive"):
            c.load(str(tiny_model), settings={"n_ctx": 512, "warp_drive": True})
        assert c.load(str(tiny_model), settings=TINY_LOAD).n_ctx == 512


def test_generate_without_model_is_an_error():
    with EngineClient() as c:
        r = collect(c, c.generate(prompt="x", sampling=greedy(2)))
        assert r.error is not None and "no model" in r.error.message


def test_load_settings_reach_llama_cpp(tiny_model):
    with EngineClient() as c:
        ld = c.load(str(tiny_model), settings=LoadSettings(n_ctx=256, n_batch=32, n_ubatch=16,
                                                            flash_attn="on"))
        assert ld.n_ctx == 256 and ld.settings["n_ubatch"] == 16 and ld.settings["flash_attn"] == "on"
        assert collect(c, c.generate(prompt=PROMPT, sampling=greedy(3))).error is None
        # llama.cpp's own refusal comes back in words: a q8_0 K cache needs head dims divisible by 32
        with pytest.raises(EngineError, match="does not divide"):
            c.load(str(tiny_model), settings=LoadSettings(n_ctx=256, type_k="q8_0", type_v="q8_0"))


def test_a_dropped_log_capture_does_not_crash_the_next_model(tiny_model):
    """llama.cpp's log callback is process-wide: a LlamaLog that is garbage-collected while still
    registered used to segfault the process at the next log line (found by the speculative tests)."""
    import gc
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import gc
        from ggufdesk.core.settings import LoadSettings, SamplingSettings
        from ggufdesk.engine.batching.batch import BatchEngine
        from ggufdesk.engine.batching.sequence import Sequence
        from ggufdesk.engine.batching.vocab import Vocab
        from ggufdesk.engine.runtime.native import LlamaLog, load_model
        s = LoadSettings(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)
        keep = load_model({str(tiny_model)!r}, s, LlamaLog())
        gc.collect()
        lm = load_model({str(tiny_model)!r}, s, LlamaLog())
        gc.collect()
        v = Vocab(lm)
        loop = BatchEngine(lm, v, emit=print, cancelled=lambda rid: False, set_batch=lambda rids: None)
        loop.submit(Sequence(rid="r", prompt=v.tokenize("the cat " * 40), max_gen=3,
                             sampling=SamplingSettings(temperature=0, max_tokens=3)))
        while loop.busy:
            loop.step()
        print("ok")
    """)
    gc.collect()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]


def test_plain_runs_calibrate_the_planner(tiny_model):
    """A plain generation records this machine's real decode speed; the planner then predicts it."""
    from ggufdesk.core import gguf_meta, hardware, planner

    assert hardware.effective_bandwidth_gbs("cpu", min_bytes=0) is None
    with EngineClient() as c:
        c.load(str(tiny_model), settings=LoadSettings(n_ctx=512, n_batch=64, n_ubatch=64))
        st = collect(c, c.generate(prompt=PROMPT, sampling=greedy(64))).stats
        collect(c, c.generate(prompt=PROMPT, sampling=greedy(8)))  # too short: not recorded
    info = gguf_meta.read_gguf(tiny_model)
    per_token, fixed = planner.weight_bytes_per_token(info), hardware.cpu_fixed_s(planner.matmuls_per_token(info))
    seconds = 1 / st.decode_tok_s  # the bandwidth is what is left after the token's fixed cost
    seconds -= fixed if fixed < 0.5 * seconds else 0.0
    bw = hardware.effective_bandwidth_gbs("cpu", min_bytes=0)
    assert bw == pytest.approx(per_token / seconds / 1e9, rel=1e-6)


def test_ready_lists_ggml_devices(engine):
    devices = engine.ready.devices
    assert devices and devices[0]["type"] == "cpu" and devices[0]["memory_total"] > 0
