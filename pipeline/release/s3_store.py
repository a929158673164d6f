"""The release store on S3 and any S3-compatible store (``S3Store``, through boto3), with its
checksummed transfers: every PUT and every part of a multipart upload carries the SHA-256 its plan
holds, so the server verifies the bytes against the manifest itself, and all of them share one
pool of MIRAI_RELEASE_CONCURRENCY requests. Its errors become ReleaseErrors that say what to do.
The interface it implements: pipeline.release.store.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

from pipeline.config import NetworkSettings, ReleaseSettings
from pipeline.release.layout import RELEASES_DIR, ReleaseError, is_month
from pipeline.release.store import (
    CHANGED_SINCE_HASHED,
    CHUNK,
    ListedKey,
    Listing,
    ObjectInfo,
    PlannedObject,
    Progress,
    ReleaseNotReady,
    ReleaseStore,
    content_type,
    read_bounded,
)

# What botocore reads whole into memory: every error's body and every response of an operation
# without a streaming body (a listing page: 1,000 keys are ~0.3 MB of XML). A hostile or broken
# endpoint's endless body is refused past this, not held; GetObject's streamed bodies (read_from,
# get_bytes' own limit) are not counted here.
MAX_RESPONSE_BYTES = 8 * 2**20


class ResponseTooLarge(ReleaseError):
    """The endpoint answered with a body past MAX_RESPONSE_BYTES where botocore reads it whole: the
    store is at fault (hostile or broken), not a submitter, so it is a ReleaseError."""


class _CappedBody:
    """A urllib3 response whose ``stream()`` (what botocore's ``AWSResponse.content`` joins into one
    bytes object) stops past ``limit`` bytes; every other use (``read``: a streamed GetObject body)
    passes through uncounted."""

    def __init__(self, raw, limit: int, where: str):
        self._raw, self._limit, self._where = raw, limit, where

    def stream(self, *args, **kwargs):
        size = 0
        for chunk in self._raw.stream(*args, **kwargs):
            size += len(chunk)
            if size > self._limit:
                self._raw.close()
                raise ResponseTooLarge(
                    f"{self._where} answered with a body over {self._limit:,} bytes where a listing or an "
                    "error is a few KB; refused, nothing was written"
                )
            yield chunk

    def __getattr__(self, name):
        return getattr(self._raw, name)


def _cap_responses(client, verify, keepalive: bool, where: str, limit: int = MAX_RESPONSE_BYTES) -> None:
    """Bound what ``client`` reads whole (``_CappedBody``). A ``before-send`` handler may return the
    response itself (https://docs.aws.amazon.com/botocore/latest/topics/events.html#before-send):
    the request is signed by then, and each retry is signed and emitted anew. It is sent through a
    session built as botocore builds the client's own (timeouts, proxies, pool size, ``verify``)."""
    import socket

    from botocore.awsrequest import AWSResponse
    from botocore.httpsession import URLLib3Session
    from botocore.utils import get_environ_proxies

    config = client.meta.config
    options = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]  # botocore's socket options
    if keepalive:
        options.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
    session = URLLib3Session(
        verify=verify,
        proxies=config.proxies if config.proxies is not None else get_environ_proxies(client.meta.endpoint_url),
        timeout=(config.connect_timeout, config.read_timeout),
        max_pool_connections=config.max_pool_connections,
        socket_options=options,
        client_cert=config.client_cert,
        proxies_config=config.proxies_config,
    )

    def send(request, **kwargs):
        # The session would read a non-streaming reply whole, uncapped, unless told it streams.
        streamed = request.stream_output
        request.stream_output = True
        try:
            sent = session.send(request)
        finally:
            request.stream_output = streamed
        response = AWSResponse(sent.url, sent.status_code, sent.headers, _CappedBody(sent.raw, limit, where))
        if not streamed or response.status_code >= 300:
            _read_whole(response, request)
        return response

    client.meta.events.register("before-send.s3", send)


def _read_whole(response, request) -> None:
    """Read what botocore reads whole here, inside the send, so a dropped or stalled body raises the
    botocore error its retries retry (https://docs.aws.amazon.com/boto3/latest/guide/retries.html),
    as before; ResponseTooLarge is not retried."""
    from botocore.exceptions import ConnectionClosedError, HTTPClientError, ReadTimeoutError, SSLError
    from urllib3.exceptions import ProtocolError
    from urllib3.exceptions import ReadTimeoutError as Urllib3ReadTimeout
    from urllib3.exceptions import SSLError as Urllib3SSLError

    try:
        response.content  # noqa: B018 (the property reads and keeps the body)
    except ReleaseError:
        raise
    except Urllib3ReadTimeout as exc:
        raise ReadTimeoutError(endpoint_url=request.url, error=exc) from exc
    except Urllib3SSLError as exc:
        raise SSLError(endpoint_url=request.url, error=exc) from exc
    except ProtocolError as exc:
        raise ConnectionClosedError(error=exc, request=request, endpoint_url=request.url) from exc
    except Exception as exc:
        raise HTTPClientError(error=exc) from exc


class S3Store(ReleaseStore):
    """s3://bucket/prefix through boto3. Credentials come from the standard AWS chain (environment,
    profile, instance role); ``signed=False`` reads a public bucket anonymously."""

    def __init__(
        self, bucket: str, prefix: str, release: ReleaseSettings, network: NetworkSettings, *, signed: bool = True
    ):
        import boto3
        import botocore.session
        from botocore import UNSIGNED
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint = release.s3_endpoint_url.rstrip("/")
        core = botocore.session.get_session()
        session = boto3.session.Session(botocore_session=core, region_name=release.s3_region or None)
        # Given explicitly, so _cap_responses' session verifies as the clients would (botocore's
        # order: ca_bundle from AWS_CA_BUNDLE or the profile, then REQUESTS_CA_BUNDLE).
        verify = core.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE") or True
        self.region = session.region_name or "us-east-1"
        # S3-compatible stores (SeaweedFS, MinIO, Ceph) rarely have per-bucket DNS names.
        s3 = {"addressing_style": "path"} if self.endpoint else {}
        config = Config(
            signature_version=UNSIGNED if not signed else None,
            retries={"max_attempts": release.s3_max_attempts, "mode": "standard"},
            connect_timeout=network.connect_timeout_s,
            read_timeout=network.read_timeout_s,
            max_pool_connections=release.concurrency + 2,
            s3=s3,
            # botocore would SHA-256 every downloaded file a second time (a single-PUT object has a
            # full-object checksum); read_from's bytes are checked against the manifest instead,
            # and get_bytes asks for botocore's check itself (ChecksumMode).
            response_checksum_validation="when_required",
        )
        self.client = session.client(
            "s3", region_name=self.region, endpoint_url=self.endpoint or None, verify=verify, config=config
        )
        # For the PUTs whose body carries its x-amz-checksum-sha256 (a signed header the server
        # verifies), SigV4 need not hash the payload as well: botocore already sends
        # UNSIGNED-PAYLOAD for them over HTTPS, but over plain HTTP (a local endpoint) it would
        # SHA-256 every byte once more, and the server too.
        self._checksummed = session.client(
            "s3",
            region_name=self.region,
            endpoint_url=self.endpoint or None,
            verify=verify,
            config=config.merge(Config(s3={**s3, "payload_signing_enabled": False})),
        )
        self.concurrency = release.concurrency
        self._public = release.public_url.rstrip("/")
        where = f"endpoint {self.endpoint}" if self.endpoint else f"AWS {self.region}"
        self.description = f"s3://{self.bucket}/{self.prefix} ({where}{'' if signed else ', anonymous'})"
        keepalive = bool(config.tcp_keepalive or core.get_config_variable("tcp_keepalive"))
        for client in (self.client, self._checksummed):
            _cap_responses(client, verify, keepalive, self.description)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def stat(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise _explain(exc, self.description) from exc
        checksum = head.get("ChecksumSHA256") or ""
        composite = checksum if "-" in checksum else None
        # A single PUT carries the server-verified SHA-256 of the whole object; a multipart upload
        # only a checksum of its parts' checksums, so it also carries our sha256 as metadata.
        digest = (
            base64.b64decode(checksum).hex() if checksum and not composite else head.get("Metadata", {}).get("sha256")
        )
        return ObjectInfo(size=head["ContentLength"], sha256=digest, modified=head["LastModified"], composite=composite)

    def put_files(
        self, files: Iterable[tuple[str, PlannedObject]], *, cache_control: str, progress: Progress | None
    ) -> None:
        """Every PUT and part of every file shares one pool of MIRAI_RELEASE_CONCURRENCY requests,
        and a file's requests start as soon as ``files`` yields it (while later files are still
        being hashed). Each request carries the plan's SHA-256 (of the object, recorded or computed,
        or of the part), so the server verifies the bytes against the manifest itself and the
        client hashes nothing twice (boto3's transfer manager would hash every byte again)."""
        uploads: dict[str, str] = {}  # key -> multipart UploadId
        pending: dict[str, list] = {}  # key -> the futures of its parts
        try:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                try:
                    for key, obj in files:
                        pending[key] = [
                            pool.submit(*task, progress) for task in self._tasks(key, obj, cache_control, uploads)
                        ]
                    for key, futures in pending.items():
                        parts = [future.result() for future in futures]
                        if key in uploads:
                            self._call(
                                "complete_multipart_upload",
                                Bucket=self.bucket,
                                Key=self._key(key),
                                UploadId=uploads.pop(key),
                                MultipartUpload={"Parts": parts},
                            )
                except BaseException:
                    pool.shutdown(cancel_futures=True)  # a failed run sends nothing more
                    raise
        finally:
            for key, upload_id in uploads.items():  # a failed run: free the parts already stored
                try:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id)
                except Exception:
                    pass

    def _tasks(self, key: str, obj: PlannedObject, cache_control: str, uploads: dict[str, str]) -> list[tuple]:
        """The requests that store one file: one PUT, or (after creating its multipart upload,
        recorded in ``uploads``) one per part, in part order."""
        head = {"ContentType": content_type(key), "CacheControl": cache_control, "Metadata": {"sha256": obj.sha256}}
        if obj.part_size is None:
            return [(self._put_whole, key, obj, head)]
        created = self._call(
            "create_multipart_upload", Bucket=self.bucket, Key=self._key(key), ChecksumAlgorithm="SHA256", **head
        )
        uploads[key] = created["UploadId"]
        return [(self._put_part, key, obj, (uploads[key], n)) for n in range(len(obj.part_sha256))]

    def _put_whole(self, key: str, obj: PlannedObject, head: dict, progress: Progress | None) -> None:
        # Streamed from the file (up to the multipart threshold, times the concurrency, would
        # otherwise sit in memory); botocore rewinds it for a retry.
        with obj.open() as body:
            self._call(
                "put_object",
                self._checksummed,
                Bucket=self.bucket,
                Key=self._key(key),
                Body=body,
                ChecksumSHA256=base64.b64encode(bytes.fromhex(obj.sha256)).decode(),
                **head,
            )
        if progress:
            progress(obj.size)

    def _put_part(self, key: str, obj: PlannedObject, upload: tuple[str, int], progress: Progress | None) -> dict:
        upload_id, n = upload
        with open(obj.path, "rb") as fh:
            body = os.pread(fh.fileno(), obj.part_size, n * obj.part_size)
        checksum = base64.b64encode(obj.part_sha256[n]).decode()
        response = self._call(
            "upload_part",
            self._checksummed,
            Bucket=self.bucket,
            Key=self._key(key),
            UploadId=upload_id,
            PartNumber=n + 1,
            Body=body,
            ChecksumSHA256=checksum,
        )
        if progress:
            progress(len(body))
        return {"PartNumber": n + 1, "ETag": response["ETag"], "ChecksumSHA256": checksum}

    def _call(self, operation: str, client=None, **kwargs) -> dict:
        from botocore.exceptions import ClientError

        try:
            return getattr(client or self.client, operation)(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"):
                raise ReleaseNotReady(
                    f"{kwargs['Key']}: the store rejected the bytes sent as not matching their "
                    f"sha256: the local file {CHANGED_SINCE_HASHED}"
                ) from exc
            raise _explain(exc, self.description) from exc

    def put_bytes(self, key: str, data: bytes, *, cache_control: str, if_absent: bool) -> bool:
        from botocore.exceptions import ClientError

        digest = hashlib.sha256(data)
        args = {
            "Bucket": self.bucket,
            "Key": self._key(key),
            "Body": data,
            "ChecksumSHA256": base64.b64encode(digest.digest()).decode(),
            "ContentType": content_type(key),
            "CacheControl": cache_control,
            "Metadata": {"sha256": digest.hexdigest()},
        }
        if if_absent:
            args["IfNoneMatch"] = "*"  # conditional write: two publishers cannot both commit a month
        try:
            self._checksummed.put_object(**args)
        except ClientError as exc:
            if _status(exc) in (409, 412):
                return False
            raise _explain(exc, self.description) from exc
        return True

    def get_bytes(self, key: str, *, limit: int | None = None) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")["Body"]
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise _explain(exc, self.description) from exc
        with body:
            return read_bounded(body, key, limit, self.description)

    def read_from(self, key: str, offset: int) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        args = {"Bucket": self.bucket, "Key": self._key(key)}
        if offset:
            args["Range"] = f"bytes={offset}-"
        try:
            body = self.client.get_object(**args)["Body"]
        except ClientError as exc:
            raise _explain(exc, self.description) from exc
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def release_months(self) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(RELEASES_DIR) + "/", Delimiter="/"
        )
        names = (p["Prefix"].rstrip("/").rsplit("/", 1)[-1] for page in pages for p in page.get("CommonPrefixes", []))
        return sorted(n for n in names if is_month(n))

    def list_keys(self, prefix: str, *, max_keys: int, start_after: str = "") -> Listing:
        from botocore.exceptions import ClientError

        args = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if start_after:
            args["StartAfter"] = self._key(start_after)
        pages = self.client.get_paginator("list_objects_v2").paginate(
            **args, PaginationConfig={"MaxItems": max_keys + 1, "PageSize": min(1000, max_keys + 1)}
        )
        strip = len(self._key(""))
        try:
            found = [
                ListedKey(
                    item["Key"][strip:], item["Size"], item["LastModified"], multipart="-" in item.get("ETag", "")
                )
                for page in pages
                for item in page.get("Contents", [])
            ]
        except ClientError as exc:
            raise _explain(exc, self.description) from exc
        return Listing(found[:max_keys], len(found) > max_keys)

    def abort_unfinished_uploads(self, prefix: str) -> list[str]:
        from botocore.exceptions import ClientError

        aborted = []
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self._key(prefix)
            )
            for upload in (u for page in pages for u in page.get("Uploads", [])):
                try:
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                except ClientError as exc:
                    if _status(exc) != 404:  # NoSuchUpload: completed or aborted by another run meanwhile
                        raise
                aborted.append(upload["Key"].removeprefix(self._key("")))
        except ClientError as exc:
            raise _explain(exc, self.description) from exc
        return aborted

    def public_url(self, key: str) -> str:
        if self._public:
            base = self._public
        elif self.endpoint:
            base = f"{self.endpoint}/{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        else:
            base = f"https://{self.bucket}.s3.{self.region}.amazonaws.com" + (f"/{self.prefix}" if self.prefix else "")
        return f"{base}/{quote(key, safe='/=')}"


def _status(exc) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _explain(exc, where: str) -> ReleaseError:
    code = exc.response.get("Error", {}).get("Code", "")
    if _status(exc) == 403:
        return ReleaseError(
            f"access denied by {where} ({code}): a private bucket needs credentials from the AWS chain "
            "(and MIRAI_RELEASE_SIGNED_DOWNLOAD=1 or --signed for `mirai download`)"
        )
    return ReleaseError(f"{where}: {code or _status(exc)}: {exc}")
