"""Corpora to token tensors (DESIGN.md §8). Knows nothing about models or training.

- ``documents``: the one reader of every source (bundled corpus, .txt, folder, .jsonl, .parquet, hf:NAME) -> documents
- ``split``: the validation split (tail, strided or random), the same for both data paths, and its record
- ``cache``: where the data caches live and how their entries are keyed
- ``tokenizer``: ``Tokenizer`` (bytes, trained BPE, any tokenizer.json) and ``load_tokenizer``
- ``tokens``: ``TokenData``, the tokenized corpus every path returns
- ``corpus``: ``prepare_data(DataConfig)``, the corpus tokenized once and cached (or a prepared folder opened)
- ``prepared``: ``scalevec prepare-data``, a large corpus as memory-mapped shards and a manifest
- ``sampler``: the fixed validation set, bits per byte and the stateless ``TrainSampler``
- ``corpora/``: the bundled corpora (Shakespeare, King James Bible; provenance in ``corpora/README.md``)
"""
