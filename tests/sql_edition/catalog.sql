-- The catalog of a pg_idem install, one line per fact, in a form two
-- installs can be compared in (diff): the C edition's and the SQL
-- edition's (pg_tle, plain script) must print the same lines.  Run with
-- psql -At -v schema=NAME.  Owners are left out (the installing role),
-- and so are the SQL edition's internal objects (idem__*), the language,
-- SECURITY DEFINER and SET clauses of functions (how a function runs,
-- not what it is to a caller).
SET search_path = :"schema";
SELECT 'function ' || p.oid::regprocedure
       || ' (' || pg_get_function_arguments(p.oid) || ') -> ' || pg_get_function_result(p.oid)
       || ' ' || p.provolatile::text || CASE WHEN p.proisstrict THEN ' strict' ELSE '' END
       || ' parallel ' || p.proparallel::text || ' rows ' || p.prorows
       || ' comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
  FROM pg_proc p
 WHERE p.pronamespace = :'schema'::regnamespace AND p.proname LIKE 'idem\_%' AND p.proname NOT LIKE 'idem\_\_%'
 ORDER BY 1;
SELECT 'grant ' || p.oid::regprocedure || ' execute to ' || coalesce(r.rolname, 'PUBLIC')
  FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
  LEFT JOIN pg_roles r ON r.oid = a.grantee
 WHERE p.pronamespace = :'schema'::regnamespace AND p.proname LIKE 'idem\_%' AND p.proname NOT LIKE 'idem\_\_%'
   AND a.grantee <> p.proowner
 ORDER BY 1;
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '-')
       || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
  FROM pg_class c
 WHERE c.relnamespace = :'schema'::regnamespace AND c.relname LIKE 'idem\_%' AND c.relkind IN ('r', 'v', 'S', 'i')
 ORDER BY 1;
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || replace(pg_get_expr(d.adbin, d.adrelid), quote_ident(:'schema') || '.', 'SCHEMA.'), '')
       || ' comment ' || coalesce(col_description(c.oid, a.attnum), '-')
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
 WHERE c.relnamespace = :'schema'::regnamespace AND c.relname LIKE 'idem\_%' AND c.relkind IN ('r', 'v', 'c')
   AND c.relname NOT LIKE 'idem\_\_%'
 ORDER BY c.relname, a.attnum;
SELECT 'constraint ' || t.relname || ' ' || k.conname || ' ' || replace(pg_get_constraintdef(k.oid), quote_ident(:'schema') || '.', 'SCHEMA.')
  FROM pg_constraint k JOIN pg_class t ON t.oid = k.conrelid
 WHERE t.relnamespace = :'schema'::regnamespace
 ORDER BY 1;
SELECT 'index ' || replace(pg_get_indexdef(i.indexrelid), quote_ident(:'schema') || '.', 'SCHEMA.')
  FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
 WHERE t.relnamespace = :'schema'::regnamespace
 ORDER BY 1;
SELECT 'trigger ' || replace(pg_get_triggerdef(g.oid), quote_ident(:'schema') || '.', 'SCHEMA.')
  FROM pg_trigger g JOIN pg_class t ON t.oid = g.tgrelid
 WHERE t.relnamespace = :'schema'::regnamespace AND NOT g.tgisinternal
 ORDER BY 1;
SELECT 'view ' || c.relname || ' ' || replace(regexp_replace(pg_get_viewdef(c.oid), '\s+', ' ', 'g'), quote_ident(:'schema') || '.', 'SCHEMA.')
  FROM pg_class c
 WHERE c.relnamespace = :'schema'::regnamespace AND c.relkind = 'v'
 ORDER BY 1;
SELECT 'relation grant ' || c.relname || ' ' || a.privilege_type || ' to ' || coalesce(r.rolname, 'PUBLIC')
  FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
  LEFT JOIN pg_roles r ON r.oid = a.grantee
 WHERE c.relnamespace = :'schema'::regnamespace AND c.relname LIKE 'idem\_%' AND c.relkind IN ('r', 'v', 'S')
   AND a.grantee <> c.relowner
 ORDER BY 1;
SELECT 'type ' || t.typname || ' ' || t.typtype::text
  FROM pg_type t
 WHERE t.typnamespace = :'schema'::regnamespace AND t.typname LIKE 'idem\_%' AND t.typname NOT LIKE 'idem\_\_%'
   AND t.typname NOT LIKE '\_%'
 ORDER BY 1;
