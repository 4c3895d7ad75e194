"""Household documents: the durable store, text extraction and chunking, and the workers that
index and summarise them."""
