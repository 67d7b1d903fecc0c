"""A trivial DAG that proves the Airflow install runs TaskFlow tasks (used by the smoke test)."""

from datetime import datetime

from airflow.sdk import dag, task


@dag(dag_id="rankstream_smoke", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def rankstream_smoke():
    @task
    def produce() -> int:
        return 41

    @task
    def consume(value: int) -> None:
        if value + 1 != 42:
            raise ValueError(f"expected 42, got {value + 1}")
        print("rankstream smoke ok:", value + 1)

    consume(produce())


rankstream_smoke()


@dag(dag_id="rankstream_smoke_fails", schedule=None, start_date=datetime(2026, 1, 1),
     catchup=False)
def rankstream_smoke_fails():
    @task
    def broken() -> None:
        raise RuntimeError("this task fails on purpose")

    broken()


rankstream_smoke_fails()
