-- PL/pgSQL, hot keys: claim; a winner releases or dies.
\set k random(1, :hot)
\set dies random(0, 1)
SELECT *, claim_id IS NOT NULL AS won
  FROM bench.plpgsql_claim(sha256(int8send(:k)), '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, interval '5 milliseconds') \gset
\if :won
\if :dies
\else
SELECT bench.plpgsql_release(sha256(int8send(:k)), :claim_id);
\endif
\endif
