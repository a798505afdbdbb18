"""dsrecipes.data: corpus sources, tokenizers, packing into blocks, and resumable batch iteration.

``prepare_data(DataConfig(...))`` loads a corpus (the Python standard library by
default, so recipes run offline), splits it into train/validation documents,
tokenizes and packs it into fixed-length blocks cached by Hugging Face datasets;
``BatchIterator`` then serves deterministic, checkpointable micro-batches per
data-parallel rank and ``eval_batches`` sequential validation batches.
"""

from dsrecipes.data.batches import BatchIterator, eval_batches
from dsrecipes.data.config import DataConfig, validate_data_config
from dsrecipes.data.packing import PreparedData, prepare_data
from dsrecipes.data.tokenizers import ByteTokenizer, HFTokenizerFile, build_tokenizer

__all__ = [
    "BatchIterator",
    "ByteTokenizer",
    "DataConfig",
    "HFTokenizerFile",
    "PreparedData",
    "build_tokenizer",
    "eval_batches",
    "prepare_data",
    "validate_data_config",
]
