-- Cache keys and request hashes: the canonical form, collisions that a
-- naive concatenation would allow, and every validation error.

-- The error a statement raises, as "SQLSTATE: message (detail)", or "ok".
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text;
    msg text;
    det text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
    RETURN st || ': ' || msg || coalesce(nullif(' (' || det || ')', ' ()'), '');
END
$$;

-- The canonical form, computed in plain SQL: SHA-256 of the domain tag
-- followed by each field as a 4-byte big-endian length and its UTF-8 bytes.
-- The C++ client computes the same bytes.
CREATE FUNCTION pg_temp.canonical(p text, m text, t text, k text) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT sha256(convert_to('pg_idem key v1', 'UTF8')
                  || int4send(octet_length(p)) || convert_to(p, 'UTF8')
                  || int4send(octet_length(m)) || convert_to(m, 'UTF8')
                  || int4send(octet_length(t)) || convert_to(t, 'UTF8')
                  || int4send(octet_length(k)) || convert_to(k, 'UTF8'))
$$;

-- A fixed vector, for the client's tests.
SELECT encode(idem_key('u', 'POST', '/p', 'k1'), 'hex') AS key_vector;

-- idem_key is the canonical form, 32 bytes, the same on every call.
SELECT idem_key(p, m, t, k) = pg_temp.canonical(p, m, t, k) AS canonical,
       octet_length(idem_key(p, m, t, k)) AS bytes,
       idem_key(p, m, t, k) = idem_key(p, m, t, k) AS stable
  FROM (VALUES ('u', 'POST', '/p', 'k1'),
               ('', '', '', 'k'),
               ('tenant-1', 'PATCH', '/orders/42?x=1', repeat('k', 255)),
               ('caf' || E'\u00e9', 'POST', '/r' || E'\u00e9', E'\u00e9')) v(p, m, t, k);

-- Moving a delimiter never yields the same key: every field is length-prefixed.
SELECT a, b, idem_key(a[1], a[2], a[3], a[4]) <> idem_key(b[1], b[2], b[3], b[4]) AS distinct_keys
  FROM (VALUES ('{a,bc,/p,k}'::text[],   '{ab,c,/p,k}'::text[]),
               ('{u,POST,/p,k}',          '{u,POS,T/p,k}'),
               ('{u,POST,/p,k1}',         '{u,POST,/pk,1}'),
               ('{"",x,/p,k}',            '{x,"",/p,k}'),
               ('{u,POST,/p,k}',          '{U,POST,/p,k}'),
               ('{u,POST,"/p ",k}',       '{u,POST,/p,"k "}'),
               ('{u,POST,/p,k}',          '{u,post,/p,k}')) v(a, b);

-- The key is not a plain hash of the concatenation, nor of the key alone.
SELECT idem_key('u', 'POST', '/p', 'k') <> sha256(convert_to('uPOST/pk', 'UTF8')) AS not_concat,
       idem_key('u', 'POST', '/p', 'k') <> sha256(convert_to('k', 'UTF8')) AS not_key_only;

-- idem_request_hash is SHA-256 of the body; the empty body has a hash too.
SELECT idem_request_hash(b) = sha256(b) AS is_sha256, octet_length(idem_request_hash(b)) AS bytes
  FROM (VALUES (''::bytea), ('\x00'::bytea), (convert_to('{"amount": 10}', 'UTF8'))) v(b);
SELECT idem_request_hash('a') <> idem_request_hash('a ') AS whitespace_matters;

-- Key length is counted in bytes: 255 are accepted, 256 are not.
SELECT octet_length(idem_key('u', 'POST', '/p', repeat('k', 255))) AS ascii_255;
SELECT octet_length(idem_key('u', 'POST', '/p', repeat(E'\u00e9', 127) || 'k')) AS utf8_255;
SELECT idem_key('u', 'POST', '/p', repeat('k', 256));
SELECT idem_key('u', 'POST', '/p', repeat(E'\u00e9', 128));
SELECT idem_key('u', 'POST', '/p', '');

-- Other fields have no length limit: they are hashed, never indexed.
SELECT octet_length(idem_key(repeat('p', 10000), 'POST', repeat('/t', 5000), 'k')) AS long_fields;

-- Every argument is required; a NULL is an error, never a NULL key.
SELECT call, pg_temp.try(call) AS result
  FROM (VALUES ($$SELECT idem_key(NULL, 'POST', '/p', 'k')$$),
               ($$SELECT idem_key('u', NULL, '/p', 'k')$$),
               ($$SELECT idem_key('u', 'POST', NULL, 'k')$$),
               ($$SELECT idem_key('u', 'POST', '/p', NULL)$$),
               ($$SELECT idem_key('u', 'POST', '/p', '')$$),
               ($$SELECT idem_key('u', 'POST', '/p', repeat('k', 256))$$),
               ($$SELECT idem_request_hash(NULL)$$)) v(call);

-- Invalid UTF-8 can only reach the key in a SQL_ASCII database: the check
-- is made whatever the database encoding.
SELECT encode(idem_key('u', 'POST', '/p', E'\xc3\xa9'), 'hex') AS utf8_key \gset
\set regress_db :DBNAME
CREATE DATABASE idem_regress_ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'
    TEMPLATE template0;
\c idem_regress_ascii
CREATE EXTENSION pg_idem;
SET client_encoding = 'SQL_ASCII';
-- The pg_temp helper does not survive \c.
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text;
    msg text;
    det text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
    RETURN st || ': ' || msg || coalesce(nullif(' (' || det || ')', ' ()'), '');
END
$$;
-- Valid UTF-8 bytes give the same key as in the UTF8 database.
SELECT encode(idem_key('u', 'POST', '/p', E'\xc3\xa9'), 'hex') = :'utf8_key' AS same_key_as_utf8_db;
SELECT idem_key('u', 'POST', '/p', E'\xff');
SELECT name, pg_temp.try(format('SELECT idem_key(%L, %L, %L, %L)', 'u', 'POST', '/p', k)) AS result
  FROM (VALUES ('lone 0xff', E'\xff'),
               ('0x80 continuation byte', E'ab\x80'),
               ('truncated 2-byte sequence', E'ok\xc3'),
               ('truncated 3-byte sequence', E'\xe2\x82'),
               ('overlong slash', E'\xc0\xaf'),
               ('UTF-16 surrogate', E'\xed\xa0\x80'),
               ('above U+10FFFF', E'\xf4\x90\x80\x80'),
               ('5-byte form', E'\xf8\x88\x80\x80\x80'),
               ('valid 4-byte', E'\xf0\x9f\x98\x80'),
               ('valid 3-byte', E'\xe2\x82\xac')) v(name, k);
-- A NUL never reaches the function: PostgreSQL refuses it on input.
SELECT idem_key('u', 'POST', '/p', E'a\x00b');
-- 128 two-byte characters are 256 bytes: the length check counts bytes here too.
SELECT idem_key('u', 'POST', '/p', repeat(E'\xc3\xa9', 128));
\c :regress_db
DROP DATABASE idem_regress_ascii;
