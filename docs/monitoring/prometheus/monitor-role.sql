-- A read-only role for prometheus-postgres-exporter with pg_idem_queries.yaml:
-- the counters, the views, and the few outbox/inbox columns the backlog
-- queries count (never a payload, a cached response or a key).
--
--   psql -d app -v ON_ERROR_STOP=1 -v schema=idem -f monitor-role.sql
--
-- Run it as the extension's owner in every database that has pg_idem
-- (schema: the extension's, default public), then give the role a password
-- or a pg_hba.conf rule.  The queries of pg_idem_queries.yaml name the
-- views unqualified, so the script also sets the role's search_path in
-- this database to the extension's schema (ALTER ROLE ... IN DATABASE):
-- whatever schema pg_idem is in, every pg_idem_* series is served.
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
-- pg_catalog first: nothing in the extension's schema can stand in for
-- count(), extract() or the other built-ins the queries use.
ALTER ROLE idem_monitor IN DATABASE :"DBNAME" SET search_path = pg_catalog, :"schema";
GRANT EXECUTE ON FUNCTION idem_stats() TO idem_monitor;
GRANT SELECT ON idem_stats, idem_inflight, idem_stuck, idem_cooling,
                idem_outbox_dead, idem_inbox_dead TO idem_monitor;
GRANT SELECT (state, available_at, created_at) ON idem_outbox TO idem_monitor;
GRANT SELECT (state, received_at, retry_at) ON idem_inbox TO idem_monitor;
