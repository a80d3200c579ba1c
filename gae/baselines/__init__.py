"""The retrieval baselines the judgment memory is measured against."""
