# Rolling upgrades (expand/contract): replicas of the previous release keep
# sending 0.2.0's SQL while the extension is updated under them.
#
# The 0.2 client's statements (client/cpp/src/runner.cpp `statements` as
# released with 0.2.0, sent unnamed-prepared with untyped parameters) run
# as an idem_client role: claims are taken on 0.2.0, ALTER EXTENSION
# pg_idem UPDATE runs while they are in flight, and then the same
# long-lived session (its prepared statements re-planned) and a new one
# renew, finalize, fail, release, replay and claim anew.  A new client
# against the previous extension learns its version from pg_extension,
# which any role may read, and refuses at connect; a call with an argument
# that 0.2.0 lacks fails with 42883, never silently.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $previous = '0.2.0';
my $node = PostgreSQL::Test::Cluster->new('rolling');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_idem'");
$node->start;
my $current = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'pg_idem'");

$node->safe_psql('postgres', 'CREATE DATABASE roll');
$node->safe_psql('roll', "CREATE EXTENSION pg_idem VERSION '$previous'");
$node->safe_psql('roll', 'CREATE ROLE replica LOGIN; GRANT idem_client TO replica');

# 0.2.0's client statements, verbatim but for the schema prefix (none).
my $cols = q{SELECT r.outcome, r.claim_id::text, r.generation, }
  . q{ceil(extract(epoch FROM r.retry_after) * 1000)::int8, }
  . q{r.response_status, r.response_headers::text, r.response_body, };
my %v02 = (
	claim => $cols
	  . q{CASE WHEN $4 AND r.outcome IN ('claimed', 'recovered_ttl', 'recovered_abandoned') }
	  . q{THEN pg_catalog.pg_try_advisory_lock($5, $6) }
	  . q{WHEN $4 AND r.outcome = 'in_progress' }
	  . q{THEN pg_catalog.pg_try_advisory_xact_lock_shared($5, $6) END }
	  . q{FROM (SELECT pg_catalog.set_config('lock_timeout', $7, true) AS lt) s }
	  . q{CROSS JOIN LATERAL idem_claim($1, $2, CASE WHEN s.lt IS NOT NULL THEN $3::interval END) r},
	lookup => $cols
	  . q{CASE WHEN $3 AND r.outcome = 'in_progress' }
	  . q{THEN pg_catalog.pg_try_advisory_xact_lock_shared($4, $5) END }
	  . q{FROM idem_lookup($1, $2) r},
	begin => $cols
	  . q{CASE WHEN $3 AND r.outcome = 'in_progress' }
	  . q{THEN pg_catalog.pg_try_advisory_xact_lock_shared($4, $5) END }
	  . q{FROM idem_begin($1, $2) r},
	renew => q{SELECT CASE WHEN s.lt IS NOT NULL THEN }
	  . q{idem_renew($1, $2::uuid, $3::interval) IS NOT NULL END }
	  . q{FROM (SELECT pg_catalog.set_config('lock_timeout', $4, true) AS lt) s},
	finalize => q{SELECT idem_finalize($1, $2::uuid, $3::int4, $4::jsonb, $5, $6), }
	  . q{pg_catalog.current_setting('idem.max_response_bytes', true)}
	  . q{ FROM (SELECT CASE WHEN $7 THEN pg_catalog.set_config(}
	  . q{'idem.max_response_bytes', '0', true) END AS forced) s},
	release => q{SELECT idem_release($1, $2::uuid)},
	fail => q{SELECT idem_fail($1, $2::uuid, $3::interval)},);

# PREPARE every statement with untyped parameters, as libpq's PQprepare with
# no types does.
my $prepare = join('', map { "PREPARE v02_$_ AS $v02{$_};\n" } sort keys %v02);

sub key { return "idem_key('replica', 'POST', '/roll', '$_[0]')" }

# One request's claim through the 0.2 statement: (outcome, claim_id, status).
sub claim
{
	my ($session, $name, $body) = @_;
	my $row = $session->query_safe(
		"EXECUTE v02_claim(" . key($name) . ", sha256('$body'), '30 s', false, 0, 0, '2s')");
	my @f = split /\|/, $row;
	return ($f[0], $f[1], $f[4]);
}

my $old = $node->background_psql('roll', on_error_stop => 1, connstr => $node->connstr('roll') . ' user=replica');
$old->query_safe($prepare);

# --- On the previous version: claims in every state.
my %id;
foreach my $name (qw(renew_me fail_me release_me finish_me))
{
	my ($outcome, $claim_id) = claim($old, $name, 'b');
	is($outcome, 'claimed', "$previous: $name claimed");
	$id{$name} = $claim_id;
}
my ($o, $done_id) = claim($old, 'done', 'b');
is( $old->query_safe(
		"EXECUTE v02_finalize(" . key('done') . ", '$done_id', 201, '{\"a\": \"b\"}', 'before', false, false)"),
	't|2MB', "$previous: finalize");
is($node->safe_psql('roll', "SELECT extversion FROM pg_extension WHERE extname = 'pg_idem'"),
	$previous, "the database runs $previous");

# --- The update, with those claims in flight and the old session open.
$node->safe_psql('roll', 'ALTER EXTENSION pg_idem UPDATE');
is($node->safe_psql('roll', "SELECT extversion FROM pg_extension WHERE extname = 'pg_idem'"),
	$current, "updated to $current with claims in flight");

# --- The old session's prepared statements on the new version.
is($old->query_safe("EXECUTE v02_renew(" . key('renew_me') . ", '$id{renew_me}', '30 s', '2s')"),
	't', 'after the update: renew of a claim taken before it');
is( $old->query_safe(
		"EXECUTE v02_finalize(" . key('renew_me') . ", '$id{renew_me}', 201, NULL, 'after', false, false)"),
	't|2MB', 'after the update: finalize of that claim');
my ($outcome, $cid, $status) = claim($old, 'renew_me', 'b');
is("$outcome $status", 'replay 201', 'after the update: its retry replays');
is($old->query_safe("EXECUTE v02_fail(" . key('fail_me') . ", '$id{fail_me}', '1 hour')"),
	't', 'after the update: fail of a claim taken before it');
($outcome) = claim($old, 'fail_me', 'b');
is($outcome, 'cooldown', 'after the update: its retry is in cooldown');
is($old->query_safe("EXECUTE v02_release(" . key('release_me') . ", '$id{release_me}')"),
	't', 'after the update: release of a claim taken before it');
($outcome) = claim($old, 'release_me', 'b');
is($outcome, 'claimed', 'after the update: a released key is claimed again');
($outcome, $cid, $status) = claim($old, 'done', 'b');
is("$outcome $status", 'replay 201', 'after the update: a response stored by the previous version replays');
($outcome) = claim($old, 'done', 'other body');
is($outcome, 'mismatch', 'after the update: another body is still a mismatch');
is( $old->query_safe("EXECUTE v02_lookup(" . key('finish_me') . ", sha256('b'), false, 0, 0)") =~ s/\|.*//sr,
	'in_progress', 'after the update: lookup sees the claim in flight');
# In-transaction mode, begun and finished on the new version.
my $begin = $old->query_safe("BEGIN; EXECUTE v02_begin(" . key('in_txn') . ", sha256('b'), false, 0, 0)");
my @b = split /\|/, $begin;
is($b[0], 'claimed', 'after the update: idem_begin through the 0.2 statement');
is( $old->query_safe(
		"EXECUTE v02_finalize(" . key('in_txn') . ", '$b[1]', 200, NULL, 'tx', true, false); COMMIT"),
	't|2MB', 'after the update: strict finalize in the same transaction commits');

# --- A new session of an old replica: prepares and runs the same text.
my $fresh = $node->background_psql('roll', on_error_stop => 1, connstr => $node->connstr('roll') . ' user=replica');
$fresh->query_safe($prepare);
is( $fresh->query_safe(
		"EXECUTE v02_finalize(" . key('finish_me') . ", '$id{finish_me}', 201, NULL, 'late', false, false)"),
	't|2MB', 'a new 0.2 session finalizes a claim taken on the previous version');
($outcome) = claim($fresh, 'brand_new', 'b');
is($outcome, 'claimed', 'a new 0.2 session claims a new key');
$old->quit;
$fresh->quit;

# --- A new client against the previous extension: it can learn the
# installed version at connect (pg_extension is readable by every role) and
# refuse with both versions named; a call the previous version lacks fails
# loudly (42883), it never falls back silently.
$node->safe_psql('postgres', 'CREATE DATABASE still_old');
$node->safe_psql('still_old', "CREATE EXTENSION pg_idem VERSION '$previous'");
is( $node->safe_psql(
		'still_old', "SET ROLE replica; SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_idem'"),
	$previous, 'an idem_client role reads the installed version');
my ($ret, $stdout, $stderr) = $node->psql('still_old',
	"SET ROLE replica; SELECT * FROM idem_claim(" . key('x') . ", sha256('b'), NULL, interval '1 s')");
like($stderr, qr/function idem_claim\(bytea, bytea, unknown, interval\) does not exist/,
	"${current}'s max_wait argument against $previous: 42883, not a silent fallback");

$node->stop;
done_testing();
