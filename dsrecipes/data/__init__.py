"""dsrecipes.data: corpus sources, tokenizers, packing into blocks, and resumable batch iteration.

``prepare_data(DataConfig(...))`` loads a corpus (the Python standard library by
default, so recipes run offline), splits it into train/validation documents,
tokenizes and packs it into fixed-length blocks cached by Hugging Face datasets;
``BatchIterator`` then serves deterministic, checkpointable micro-batches per
data-parallel rank and ``eval_batches`` sequential validation batches.
"""

from dsrecipes.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "BatchIterator": "dsrecipes.data.batches",
    "eval_batches": "dsrecipes.data.batches",
    "DataConfig": "dsrecipes.data.config",
    "validate_data_config": "dsrecipes.data.config",
    "PreparedData": "dsrecipes.data.packing",
    "prepare_data": "dsrecipes.data.packing",
    "ByteTokenizer": "dsrecipes.data.tokenizers",
    "HFTokenizerFile": "dsrecipes.data.tokenizers",
    "build_tokenizer": "dsrecipes.data.tokenizers",
}

__all__ = sorted(_EXPORTS)


# Lazy, so that importing the schema (dsrecipes.data.config) does not import datasets and pandas
# (~1 s): the launching process only composes and validates the recipe.
__getattr__ = lazy_exports(__name__, _EXPORTS)
