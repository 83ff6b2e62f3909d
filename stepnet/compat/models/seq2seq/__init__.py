"""Caffe2's caffe2.python.models.seq2seq library: seq2seq_util (vocabularies, the LSTM encoder, the attention
decoder, the output projection), seq2seq_model_helper (Seq2SeqModelHelper) and beam_search
(BeamSearchForwardOnly). Caffe2's programs of that package, train.py and translate.py, import them by these
names and run unchanged on them (`python -m stepnet.compat train.py ...`)."""
