"""caffe2.python.models.seq2seq on stepnet: stepnet's library (stepnet.compat.models.seq2seq) builds the nets
Caffe2's own library builds, and Caffe2's programs, vendored unchanged (tests/compat/programs/seq2seq), train a
tiny attention model and translate with it. Caffe2's own tests of the package run from that folder (its
conftest.py)."""
import contextlib
import importlib
import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepnet.compat import alias
from stepnet.compat.models.seq2seq import seq2seq_util
from stepnet.compat.models.seq2seq.seq2seq_model_helper import Seq2SeqModelHelper
from stepnet.compat.state import reset

SEQ2SEQ = Path(__file__).resolve().parent / "programs" / "seq2seq"
PROGRAMS = SEQ2SEQ / "caffe2" / "python" / "models" / "seq2seq"
PACKAGE = "caffe2.python.models.seq2seq."
LIBRARY = ("seq2seq_util", "seq2seq_model_helper", "beam_search")   # in an order each imports only those before


@contextlib.contextmanager
def programs_on(library: str):
    """Fresh train and translate modules (Caffe2's programs) importing `library`'s seq2seq modules: 'stepnet'
    (stepnet.compat.models.seq2seq) or 'caffe2' (Caffe2's own copies in programs/seq2seq/reference)."""
    alias.install(roots=[SEQ2SEQ])
    package = importlib.import_module(PACKAGE.rstrip("."))
    names = [PACKAGE + m for m in (*LIBRARY, "train", "translate")]
    saved = {n: sys.modules.get(n) for n in names}
    attributes = {m: package.__dict__.get(m) for m in LIBRARY}
    try:
        for name in names:
            sys.modules.pop(name, None)
        for module in LIBRARY:
            if library == "caffe2":   # `import caffe2...seq2seq_util as x` may read the package's attribute
                spec = importlib.util.spec_from_file_location(PACKAGE + module, SEQ2SEQ / "reference" / f"{module}.py")
                loaded = sys.modules[PACKAGE + module] = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(loaded)
            else:
                loaded = importlib.import_module(PACKAGE + module)
            setattr(package, module, loaded)
        yield importlib.import_module(PACKAGE + "train"), importlib.import_module(PACKAGE + "translate")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for module, value in attributes.items():
            if value is not None:
                setattr(package, module, value)


def built_nets(train, translate, model_params) -> list[str]:
    """The text of every net train.py's model and translate.py's beam decoder build for model_params."""
    reset()
    trainer = train.Seq2SeqModelCaffe2(dict(model_params, batch_size=2, optimizer_params=dict(learning_rate=0.1),
                                            max_gradient_norm=1.0), 20, 20, num_gpus=0)
    trainer._build_model(init_params=True)
    nets = [trainer.model.param_init_net, trainer.model.net, trainer.forward_net]
    texts = [str(n.Proto()) for n in nets]
    reset()
    vocab = {i: str(i) for i in range(20)}
    decoder = translate.Seq2SeqModelCaffe2EnsembleDecoder(dict(
        ensemble_models=[dict(source_vocab=vocab, target_vocab=vocab, model_params=model_params, model_file="")],
        decoding_params=dict(beam_size=3, word_reward=0, unk_reward=0)))
    texts += [str(decoder.model.param_init_net.Proto()), str(decoder.model.net.Proto())]
    reset()
    return texts


def beam_search_nets(beam_search) -> list[str]:
    """A BeamSearchForwardOnly around a made-up step, with every option."""
    reset()
    model = Seq2SeqModelHelper()
    search = beam_search.BeamSearchForwardOnly(beam_size=2, model=model, eos_token_id=2, post_eos_penalty=-3.0)
    step = search.get_step_model()
    state_prev = step.net.AddExternalInput("state_prev")
    state = step.net.Add([state_prev, search.get_previous_tokens()], "state", broadcast=1)
    config = search.StateConfig(model.param_init_net.ConstantFill([], "state_init", shape=[1, 4], value=0.0),
                                search.LinkConfig(state_prev, 0, 1), search.LinkConfig(state, 1, 1))
    outputs = search.apply(inputs="encoder_inputs", length="length", log_probs="log_probs", attentions="attentions",
                           state_configs=[config], data_dependencies=["dependency"], word_rewards="word_rewards",
                           possible_translation_tokens="possible_tokens", go_token_id="go")
    texts = [str(model.param_init_net.Proto()), str(model.net.Proto()), [str(o) for o in outputs]]
    reset()
    return texts


ATTENTION = dict(attention="regular", decoder_layer_configs=[dict(num_units=8)],
                 encoder_type=dict(encoder_layer_configs=[dict(num_units=4)], use_bidirectional_encoder=True),
                 encoder_embedding_size=3, decoder_embedding_size=3, decoder_softmax_size=None)
MODELS = {
    "attention": ATTENTION,
    "two_layers_dropout_softmax": dict(
        ATTENTION, decoder_layer_configs=[dict(num_units=8), dict(num_units=8)], decoder_softmax_size=5,
        encoder_type=dict(encoder_layer_configs=[dict(num_units=4, dropout_keep_prob=0.8), dict(num_units=6)],
                          use_bidirectional_encoder=True)),
    "no_attention": dict(ATTENTION, attention="none", decoder_layer_configs=[dict(num_units=8)] * 3,
                         encoder_type=dict(encoder_layer_configs=[dict(num_units=8)])),
}


@pytest.fixture
def fixed_time(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1.5e9)   # train.py keeps its start time in a parameter


@pytest.mark.parametrize("config", sorted(MODELS))
def test_stepnet_builds_the_nets_caffe2s_library_builds(config, fixed_time):
    """Reference: Caffe2's seq2seq_util / seq2seq_model_helper / beam_search at 157ff81a, the same programs on
    top: every op, blob name, argument and step net of the training model, its forward model and the beam
    decoder agree (what translate.py's checkpoint loading and the beam search's step-net links rely on)."""
    with programs_on("caffe2") as (train, translate):
        expected = built_nets(train, translate, MODELS[config])
    with programs_on("stepnet") as (train, translate):
        assert built_nets(train, translate, MODELS[config]) == expected


def test_the_beam_search_with_every_option_is_caffe2s():
    """post_eos_penalty, word rewards, a reduced vocabulary, a GO-token blob and a decoder state of the caller's."""
    spec = importlib.util.spec_from_file_location("reference_beam_search", SEQ2SEQ / "reference" / "beam_search.py")
    with programs_on("stepnet"):
        reference = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(reference)
        from stepnet.compat.models.seq2seq import beam_search
        assert beam_search_nets(beam_search) == beam_search_nets(reference)


def test_the_comparison_sees_a_different_net(monkeypatch, fixed_time):
    """The check above fails for a library that differs in one choice (recurrent attention for 'regular')."""
    with programs_on("caffe2") as (train, translate):
        expected = built_nets(train, translate, ATTENTION)
    monkeypatch.setitem(seq2seq_util.ATTENTION_TYPES, "regular", seq2seq_util.attention.AttentionType.Recurrent)
    with programs_on("stepnet") as (train, translate):
        assert built_nets(train, translate, ATTENTION) != expected


def test_vocabulary_and_numberized_sentences(tmp_path):
    """Ids by hand: PAD GO EOS UNK are 0-3, then tokens seen more than unk_threshold times in order of first
    appearance; unknown tokens are UNK."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("x y x\n  z x y \nw\n")
    vocab = seq2seq_util.gen_vocab(str(corpus), unk_threshold=1)
    assert dict(vocab) == {"<PAD>": 0, "<GO>": 1, "<EOS>": 2, "<UNK>": 3, "x": 4, "y": 5}
    assert seq2seq_util.get_numberized_sentence(" y w x \n", vocab) == [5, 3, 4]
    assert len(seq2seq_util.gen_vocab(str(corpus), unk_threshold=0)) == 8


def test_dropout_layers_train(monkeypatch):
    """Dropout in encoder and decoder layers (DropoutCell's forward and gradient in both RecurrentNetworks), a
    bidirectional first layer, two layers each side and a softmax layer: 15 steps on one batch more than halve
    the loss (about 18 to about 9 in trial runs). Seeded (STEPNET_SEED, a fresh workspace): unseeded, about one
    run in 60 drew initial weights and dropout masks that left the last losses just above 0.6 of the first."""
    monkeypatch.setenv("STEPNET_SEED", "0")
    reset()
    params = dict(MODELS["two_layers_dropout_softmax"], batch_size=2, optimizer_params=dict(learning_rate=0.5),
                  max_gradient_norm=1.0)
    params["decoder_layer_configs"] = [dict(num_units=8, dropout_keep_prob=0.7), dict(num_units=8)]
    batch = [([4, 5, 6], [6, 5, 4]), ([7, 8], [8, 7])]
    with programs_on("stepnet") as (train, _):
        model = train.Seq2SeqModelCaffe2(params, 10, 10, num_gpus=0)
        model.initialize_from_scratch()
        losses = [float(model.step(batch, forward_only=False)) for _ in range(15)]
    assert min(losses[-3:]) < 0.6 * losses[0], losses


def write_reversal_corpus(folder: Path, sentences: int) -> None:
    """Sentences of 1-3 different words out of 5, each target the source reversed."""
    import random
    rng = random.Random(0)
    sources = [rng.sample("abcde", rng.randint(1, 3)) for _ in range(sentences)]
    (folder / "src.txt").write_text("".join(" ".join(s) + "\n" for s in sources))
    (folder / "tgt.txt").write_text("".join(" ".join(reversed(s)) + "\n" for s in sources))


def run_program(name, *args, cwd, stdin=None) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-W", "ignore", "-m", "stepnet.compat", str(PROGRAMS / name), *args],
                         capture_output=True, text=True, timeout=600, cwd=cwd, input=stdin)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def test_a_tiny_attention_model_learns_to_reverse_sentences(tmp_path):
    """train.py (attention, one 16-unit LSTM layer each side, embeddings of 8) on 48 made-up sentence pairs,
    30 epochs: the training loss falls (about 300 to about 1; lr 1.0 makes it jumpy, not monotonic). translate.py
    (beam 3) with the last checkpoint then reverses every training sentence (its output ends with <EOS>, as
    Caffe2's translate.py prints it). The initial weights are random on every run, as in Caffe2 (no seed): 30
    epochs were right in 7 runs of 7 (20 epochs: in 4 of 6, a 3-word sentence or two wrong)."""
    write_reversal_corpus(tmp_path, 48)
    model = ["--source-corpus", "src.txt", "--target-corpus", "tgt.txt", "--unk-threshold", "0", "--use-attention",
             "--encoder-cell-num-units", "16", "--encoder-num-layers", "1", "--decoder-cell-num-units", "16",
             "--decoder-num-layers", "1", "--encoder-embedding-size", "8", "--decoder-embedding-size", "8"]
    trained = run_program("train.py", *model, "--source-corpus-eval", "src.txt", "--target-corpus-eval", "tgt.txt",
                          "--batch-size", "8", "--epochs", "30", "--learning-rate", "1.0", "--checkpoint", "ckpt",
                          cwd=tmp_path)
    losses = [float(x) for x in re.findall(r"^\ttraining loss (\S+)$", trained.stderr, re.M)]
    assert len(losses) == 30 and losses[-1] < losses[0] / 50 and max(losses[15:]) < losses[0] / 5, losses
    assert (tmp_path / "checkpoint").read_text().startswith('model_checkpoint_path: "ckpt-29"')
    sources = (tmp_path / "src.txt").read_text()
    translated = run_program("translate.py", *model, "--checkpoint", "ckpt-29", "--beam-size", "3", cwd=tmp_path,
                             stdin=sources)
    expected = [" ".join(reversed(line.split())) + " <EOS>" for line in sources.splitlines()]
    assert translated.stdout.splitlines() == expected
