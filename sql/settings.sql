-- Settings that depend on one another are refused when set (SET, RESET,
-- ALTER ROLE/DATABASE/SYSTEM ... SET), with the range in the message in
-- the units SHOW uses; values applied at session start are checked when a
-- function uses them.  Messages of the argument checks use the same units.

\set VERBOSITY default

-- idem.lease above idem.max_lease: refused at SET, the value kept.
SET idem.lease = '2h';
SHOW idem.lease;
SET idem.lease = '1h';                  -- the bound itself is allowed
SET idem.lease = '3600001ms';
RESET idem.lease;

-- idem.failure_cooldown likewise.
SET idem.failure_cooldown = '90min';
SET idem.failure_cooldown = '1h';
RESET idem.failure_cooldown;

-- Raising idem.max_lease first (superuser) makes room; lowering it below
-- what this session uses is refused until that is lowered first.
SET idem.max_lease = '3h';
SET idem.lease = '2h';
SET idem.max_lease = '1h';
SET idem.failure_cooldown = '150min';
SET idem.lease = '30s';
SET idem.max_lease = '1h';
SET idem.max_lease = '2min';
SHOW idem.max_lease;
RESET ALL;

-- ALTER ROLE / ALTER DATABASE ... SET are checked when issued.
CREATE ROLE regress_idem_settings LOGIN;
GRANT idem_client TO regress_idem_settings;
ALTER ROLE regress_idem_settings SET idem.lease = '2h';
ALTER ROLE regress_idem_settings SET idem.failure_cooldown = '1d';
ALTER ROLE regress_idem_settings SET idem.lease = '10s';
SELECT unnest(setconfig) FROM pg_db_role_setting
 WHERE setrole = 'regress_idem_settings'::regrole;

-- A combination that only appears at session start (here: a role setting
-- accepted under a larger idem.max_lease) is refused when a claim uses it.
SELECT current_user AS admin \gset
SET idem.max_lease = '3h';
ALTER ROLE regress_idem_settings SET idem.lease = '2h';
RESET idem.max_lease;
\c - regress_idem_settings
SHOW idem.lease;
SELECT outcome FROM idem_claim(idem_key('regress', 'POST', '/settings', 'from-role'), sha256('b'));
SELECT outcome FROM idem_claim(idem_key('regress', 'POST', '/settings', 'from-role'), sha256('b'), '2h');
\c - :admin
ALTER ROLE regress_idem_settings RESET ALL;

-- Argument messages use the same units.
SELECT idem_claim(idem_key('regress', 'POST', '/settings', 'arg'), sha256('b'), '90 minutes');
SELECT idem_claim(idem_key('regress', 'POST', '/settings', 'arg'), sha256('b'), '1 hour 1.5 ms');
SELECT idem_fail(idem_key('regress', 'POST', '/settings', 'arg'), gen_random_uuid(), '2 days');

-- postgresql.conf through ALTER SYSTEM is checked as well.
ALTER SYSTEM SET idem.lease = '2h';

DROP OWNED BY regress_idem_settings;
DROP ROLE regress_idem_settings;
