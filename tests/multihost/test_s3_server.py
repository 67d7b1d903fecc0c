"""The S3-compatible server of infra/s3 (SeaweedFS's `weed server -s3`, a real server process
on loopback): started and stopped by its scripts, it stores objects, and it honours the
conditional writes an object store without atomic rename needs for exactly-once commits
(If-None-Match: * creates only, If-Match replaces only the version read); pyarrow's S3 layer
reads what it stores."""

from __future__ import annotations

import pytest

from tests.multihost.conftest import s3_server


def _client(endpoint: str, key: str, secret: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key,
                        aws_secret_access_key=secret, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"max_attempts": 2}))


def _status(err) -> int:
    return int(err.response["ResponseMetadata"]["HTTPStatusCode"])


def test_the_server_stores_objects_and_refuses_stale_conditional_writes(tmp_path):
    from botocore.exceptions import ClientError

    with s3_server(tmp_path) as (endpoint, key, secret):
        s3 = _client(endpoint, key, secret)
        s3.create_bucket(Bucket="events")
        first = s3.put_object(Bucket="events", Key="seg/000001.parquet", Body=b"one",
                              IfNoneMatch="*")
        with pytest.raises(ClientError) as again:       # a second writer of the same segment
            s3.put_object(Bucket="events", Key="seg/000001.parquet", Body=b"two",
                          IfNoneMatch="*")
        assert _status(again.value) == 412
        assert s3.get_object(Bucket="events", Key="seg/000001.parquet")["Body"].read() == b"one"

        s3.put_object(Bucket="events", Key="manifest.json", Body=b'{"end": 1}')
        read = s3.head_object(Bucket="events", Key="manifest.json")["ETag"]
        s3.put_object(Bucket="events", Key="manifest.json", Body=b'{"end": 2}', IfMatch=read)
        with pytest.raises(ClientError) as stale:       # compare-and-swap with an old ETag
            s3.put_object(Bucket="events", Key="manifest.json", Body=b'{"end": 3}',
                          IfMatch=read)
        assert _status(stale.value) == 412
        assert s3.get_object(Bucket="events", Key="manifest.json")["Body"].read() == \
            b'{"end": 2}'
        assert first["ETag"]

        from pyarrow import fs

        layer = fs.S3FileSystem(access_key=key, secret_key=secret, endpoint_override=endpoint,
                                scheme="http", region="us-east-1")
        with layer.open_input_stream("events/seg/000001.parquet") as fh:
            assert fh.read() == b"one"
        with pytest.raises(ClientError) as refused:
            _client(endpoint, key, "wrong-secret").list_objects_v2(Bucket="events")
        assert _status(refused.value) == 403
