# Autovacuum lends nobody's scope to code planted in an index expression.
#
# A role's table has an expression index whose function calls pg_idem.
# Autovacuum's ANALYZE evaluates index expressions as the table's owner in
# a security-restricted operation, with no human action (the function,
# immutable when the index was built, is volatile by now): on 0.4.0 the
# planted code ran with the superuser's scope (GetOuterUserId) and copied
# the superuser's cached response into its own table.  pg_idem refuses to
# act inside a security-restricted operation: the worker's ANALYZE fails
# with 42501 (in the server log) and the planter's table stays empty.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The bait's own inserts run the planted code too, as the planter, which
# finds nothing of its own: loot rows without a body.
my $node = IdemTest::new_node('autovacuum_restricted', 'autovacuum_naptime = 1');

$node->safe_psql('postgres', q{
SELECT idem_finalize(idem_key('su', 'POST', '/av', 'k'), claim_id, 200, NULL, 'the superuser''s')
  FROM idem_claim(idem_key('su', 'POST', '/av', 'k'), sha256('b'));
CREATE ROLE planter;
GRANT idem_client TO planter;
GRANT CREATE ON SCHEMA public TO planter;
SET ROLE planter;
CREATE TABLE public.loot (outcome text, body bytea);
CREATE FUNCTION public.planted(n int) RETURNS int LANGUAGE sql IMMUTABLE AS $$ SELECT n $$;
CREATE TABLE public.bait (n int) WITH (autovacuum_analyze_threshold = 0,
                                       autovacuum_analyze_scale_factor = 0);
CREATE INDEX bait_planted ON public.bait (public.planted(n));
CREATE OR REPLACE FUNCTION public.planted(n int) RETURNS int LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public AS $$
BEGIN
    INSERT INTO public.loot
    SELECT outcome, response_body FROM idem_lookup(idem_key('su', 'POST', '/av', 'k'), sha256('b'));
    RETURN n;
END
$$;
INSERT INTO public.bait SELECT g FROM generate_series(1, 100) g;
});

# Wait (generously) until autovacuum has analyzed the table (as it does
# on 0.4.0) or failed to (the refusal in the server log).
my $refusal = qr/ERROR:  pg_idem cannot be used inside a security-restricted operation\n.*DETAIL:  The call runs as role "planter"/;
my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
my ($refused, $analyzed) = (0, 0);
while (time() < $deadline)
{
	$refused = slurp_file($node->logfile) =~ $refusal;
	$analyzed = $node->safe_psql('postgres',
		"SELECT autoanalyze_count > 0 FROM pg_stat_user_tables WHERE relname = 'bait'") eq 't';
	last if $refused || $analyzed;
	sleep(1);
}
ok($refused, "autovacuum's ANALYZE is refused inside the planted index expression, naming the planter");
ok(!$analyzed, 'and the analyze did not complete');
is($node->safe_psql('postgres', 'SELECT count(*) FROM public.loot WHERE body IS NOT NULL'),
	'0', "the planted code read nothing of the superuser's");
is( $node->safe_psql(
		'postgres',
		"SELECT outcome || ' ' || convert_from(response_body, 'UTF8')
		   FROM idem_lookup(idem_key('su', 'POST', '/av', 'k'), sha256('b'))"),
	"replay the superuser's",
	"the superuser's key is as it was");

$node->stop;
done_testing();
