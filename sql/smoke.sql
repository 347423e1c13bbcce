SELECT encode(idem_key('u', 'POST', '/p', 'k1'), 'hex');
