-- The server's idem_key() and idem_request_hash() against the protocol's test
-- vectors (the clients' suites check the same ones).
-- Generated from extension/protocol/protocol.toml by extension/protocol/generate.py: do not edit.
SELECT left(v.key, 40) AS key, encode(idem_key(v.principal, v.method, v.target, v.key), 'hex') = v.cache_key AS same
  FROM (VALUES
    ('alice', 'POST', '/payments', 'k-1', '3cc5707a6bed2a1824ebee218b50d1f7414cf02f0e6e2cb50e03bfa85dca2c62'),
    ('', 'POST', '/', 'a', '2cd8b0f0cc48fb1894934ed711fe12f911650830edb3bb12214c0026b1939060'),
    ('tenant:42/user:7', 'PATCH', '/orders/9?expand=items&x=1', '550e8400-e29b-41d4-a716-446655440000', '982c5d2b4d4a9fc76d691c3f5737cacd282b6e8f666a54d7ac5eb1d1cd41fe36'),
    ('ab', 'c', '/', 'k', 'd68f427001f1ad7b0f5a0c7163472f9e4f7eb9d5b2f182b0293d3626f8236a88'),
    ('a', 'bc', '/', 'k', '35b861bf78f4d319354042411e63cb2b851261f7d718904b1893a7f425f759cf'),
    ('zoë', 'PUT', '/résumé', 'clé-€-𝄞', '4f5578adf9764498da058a0d9469b41acc596b83bb47c845a96342de6e816261'),
    ('bob', 'POST', '/long', 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk', '9ad04b9daed9709ee5f34ac20ee335d1706089c7a0024165eeac7dde91c6ca29')
  ) AS v(principal, method, target, key, cache_key)
 ORDER BY 1;
SELECT v.body, encode(idem_request_hash(convert_to(v.body, 'UTF8')), 'hex') = v.request_hash AS same
  FROM (VALUES
    ('', 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'),
    ('abc', 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'),
    ('{"amount": 5}', 'ba0045583c6e765a5ba6d529a963e2fda41f894a79277f5f94b51f8184a3936a')
  ) AS v(body, request_hash)
 ORDER BY 1;
