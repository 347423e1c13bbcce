# Pins a fix from the review of the direct path (keys/key_table.c): an idem_* call made while another one
# of the same backend is inside key_table_open/close, from a trigger on
# idem_keys (an audit trigger that looks the key up, say).
#
# 0.3.0 ran each call's SQL through SPI, which nests: the trigger's
# idem_lookup answered.  Now the kept KeyTable is one per backend: the
# nested call fails with "idem_keys is already in use by this call", and
# when the trigger catches that error (PL/pgSQL EXCEPTION), the
# subtransaction abort runs forget_aborted_call, which clears in_use and
# marks the state stale *for the outer call, still running*; the trigger's
# next idem_lookup then rebuilds (MemoryContextDelete of the EState the
# outer AfterTriggerEndQuery is using), and its key_table_close sets
# kt->rel = NULL, so the outer key_table_close calls table_close(NULL):
# SIGSEGV at key_table.c:421, and the postmaster restarts every backend.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = IdemTest::new_node('nested_call');

$node->safe_psql('postgres', q{
	CREATE TABLE public.nested_lookups_seen (step text, outcome text);
	CREATE FUNCTION public.lookup_from_trigger() RETURNS trigger
	LANGUAGE plpgsql SET search_path = pg_catalog AS $$
	BEGIN
		BEGIN
			INSERT INTO public.nested_lookups_seen
			SELECT 'first', outcome FROM public.idem_lookup(NEW.cache_key, public.idem_request_hash('x'));
		EXCEPTION WHEN others THEN
			INSERT INTO public.nested_lookups_seen VALUES ('first failed', SQLERRM);
		END;
		INSERT INTO public.nested_lookups_seen
		SELECT 'second', outcome FROM public.idem_lookup(NEW.cache_key, public.idem_request_hash('x'));
		RETURN NULL;
	END $$;
	CREATE TRIGGER lookup_from_trigger AFTER INSERT OR UPDATE ON public.idem_keys
		FOR EACH ROW EXECUTE FUNCTION public.lookup_from_trigger();
});

my $log_offset = -s $node->logfile;
my ($rc, $out, $err) = $node->psql('postgres', q{
	SELECT outcome FROM idem_claim(idem_key('nested_call', 'POST', '/nested', 'k1'),
	                               idem_request_hash('x'));
});
is($rc, 0, 'a claim whose trigger looks the key up returns') or diag($err);
is($out, 'claimed', 'the claim is claimed');
my $log = slurp_file($node->logfile, $log_offset);
my $crashed = $log =~ /terminated by signal/;
ok(!$crashed, 'no backend crashed');
if ($crashed)
{
	# restart_after_crash is off in the test clusters: the server is down.
	$node->stop('immediate', fail_ok => 1);
	done_testing();
	exit 0;
}

is( $node->safe_psql('postgres', q{SELECT step || ' ' || outcome FROM public.nested_lookups_seen ORDER BY 1}),
	"first in_progress\nsecond in_progress",
	'both nested lookups answered, as through SPI in 0.3.0');

$node->stop;
done_testing();
