// @tomoribot/ltm-client/testing: the worker and its services for a shard's own integration tests (README.md
// "Testing your shard"). Needs the optional peer dependencies testcontainers and pg; the main entry never loads this.
export {
  DEFAULT_START_TIMEOUT_MS,
  LtmStackStartError,
  STACK_LABEL,
  attachLtmStack,
  containerEngineProblem,
  getLtmStack,
  startLtmStack,
  stopLtmStack,
  type LtmStack,
  type LtmStackOptions,
  type SeededWorld,
  type StackShard,
} from "./stack.js";
export { POSTGRES_IMAGE, RABBITMQ_IMAGE, REDIS_IMAGE, SERVICE_IMAGES, WORKER_IMAGE, resolveImage, type ServiceImage } from "./images.js";
