-- A read-only role for prometheus-postgres-exporter with pg_idem_queries.yaml:
-- the counters, the views, and the few outbox/inbox columns the backlog
-- queries count (never a payload, a cached response or a key).
--
--   psql -d app -v ON_ERROR_STOP=1 -v schema=idem -f monitor-role.sql
--
-- Run it as the extension's owner in every database that has pg_idem
-- (schema: the extension's, default public), then give the role a password
-- or a pg_hba.conf rule.  The exporter's role also needs the extension's
-- schema on its search_path when that is not public:
--   ALTER ROLE idem_monitor SET search_path = idem;
\set ON_ERROR_STOP 1
\if :{?schema}
\else
\set schema public
\endif
SET search_path = :"schema";
SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idem_monitor') AS create_role \gset
\if :create_role
CREATE ROLE idem_monitor LOGIN;
\endif
GRANT USAGE ON SCHEMA :"schema" TO idem_monitor;
GRANT EXECUTE ON FUNCTION idem_stats() TO idem_monitor;
GRANT SELECT ON idem_stats, idem_inflight, idem_stuck, idem_cooling,
                idem_outbox_dead, idem_inbox_dead TO idem_monitor;
GRANT SELECT (state, available_at, created_at) ON idem_outbox TO idem_monitor;
GRANT SELECT (state, received_at, retry_at) ON idem_inbox TO idem_monitor;
