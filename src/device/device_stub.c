/* device.h for builds without the CUDA toolkit (COLLIE_CUDA=OFF or not found):
 * no devices, and one INFO line saying the device path is off. */
#include "../core.h"
#include "device.h"

int device_count(void) {
  INFO_ONCE(LOG_INIT, "CUDA device path off: collie was built without CUDA (host buffers only)");
  return 0;
}
int device_current(void) { return -1; }
int device_set(int dev) {
  (void)dev;
  return -1;
}
void device_pci_bus_id(int dev, char* buf, size_t len) {
  (void)dev;
  if (len) buf[0] = '\0';
}
const char* device_runtime(void) { return "none"; }
int device_is_device_ptr(const void* p) {
  (void)p;
  return 0;
}
