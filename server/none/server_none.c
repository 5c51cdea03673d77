/*
 * server/none/server_none.c - the HTTP side of `lmstore serve` in a build
 * without libmicrohttpd (Debian: libmicrohttpd-dev): lms__server_available
 * is false and starting the server fails saying why. It replaces
 * server/http.c; the rest of server/ builds either way.
 */
#include "server/server.h"

#include "common/common.h"

bool lms__server_available(void) { return false; }

int lms__server_start(const lms__server_params *p, lms__server **out)
{
    (void)p;
    *out = NULL;
    return lms__err(LMS_EUNSUPPORTED, "this lmstore was built without libmicrohttpd (Debian: libmicrohttpd-dev): "
                                      "`lmstore serve` is not available");
}

uint16_t lms__server_port(const lms__server *s) { return (void)s, 0; }
void lms__server_drain(lms__server *s) { (void)s; }
int lms__server_in_flight(lms__server *s) { return (void)s, 0; }
void lms__server_stop(lms__server *s) { (void)s; }
