"""Training: model configs, the algorithm registry, id maps, datasets, trainers, checkpoints,
the retrain loop and its Airflow task adapters."""
