"""What a failed request means: the answers callers handle (a missing key, a lost create-only
race) are passed on; everything else becomes a one-line :class:`StorageError` that says what
to do."""

from __future__ import annotations

HANDLED_STATUSES = (404, 409, 412)       # missing key, create-only race: callers decide
_CREDENTIAL_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")


class StorageError(RuntimeError):
    """The object store cannot be reached or refused a request; the message says what to do."""


def error_code(err) -> str:
    """The S3 error code of a botocore ``ClientError`` (``""`` if none)."""
    return err.response.get("Error", {}).get("Code", "")


def http_status(err) -> int | None:
    """The HTTP status of a botocore ``ClientError``."""
    return err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def is_missing(err) -> bool:
    """Whether a ``ClientError`` says the key does not exist."""
    return error_code(err) in ("NoSuchKey", "404")


def lost_create_race(err) -> bool:
    """Whether a ``ClientError`` of a create-only put says another writer created the key."""
    return http_status(err) in (409, 412)


def request(what: str, fn, *, bucket: str, where: str, endpoint: str | None, **kwargs):
    """``fn(Bucket=bucket, **kwargs)``: one request; an unreachable server or a refusal becomes a
    one-line :class:`StorageError` (``what`` and ``where`` name the request and its location in
    the message), the answers in :data:`HANDLED_STATUSES` stay ``ClientError``."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(Bucket=bucket, **kwargs)
    except ClientError as err:
        code = error_code(err)
        if code == "NoSuchBucket":
            raise StorageError(f"bucket {bucket!r} does not exist at {endpoint or 'AWS'}: "
                               f"create it with `rankstream store create-bucket --store "
                               f"s3://{bucket}`, or point RANKSTREAM_STORE at one that "
                               "does") from None
        if code in _CREDENTIAL_CODES:
            raise StorageError(f"the object store refused {what} in {where} ({code}): "
                               "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY") from None
        status = http_status(err)
        if status in HANDLED_STATUSES or is_missing(err):
            raise                                   # answers the callers handle
        raise StorageError(f"the object store failed {what} in {where} "
                           f"(HTTP {status} {code}) after retries; try again") from None
    except BotoCoreError as err:
        raise StorageError(f"cannot reach the object store for {where} "
                           f"({type(err).__name__}: {err}); is it running? "
                           "(AWS_ENDPOINT_URL)") from None
